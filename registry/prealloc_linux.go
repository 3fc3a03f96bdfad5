package registry

import (
	"os"
	"syscall"
)

// preallocate reserves size bytes of disk for a fill before any byte arrives, so that a full disk
// is found before callers are answered rather than halfway through an object. The file's size is
// kept (FALLOC_FL_KEEP_SIZE): it grows as bytes are written. A file system that cannot
// preallocate is not an error.
func preallocate(f *os.File, size int64) error {
	if size <= 0 {
		return nil
	}
	const keepSize = 0x1 // FALLOC_FL_KEEP_SIZE
	err := syscall.Fallocate(int(f.Fd()), keepSize, 0, size)
	if err == syscall.ENOSPC || err == syscall.EDQUOT {
		return err
	}
	return nil
}
