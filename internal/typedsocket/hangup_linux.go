package typedsocket

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// watchHangup watches raw's socket for its peer's close without reading from it: gone is closed
// when the peer has shut down its side or reset the connection; stop ends the watch and returns
// once it has ended. gone is nil when the socket cannot be watched.
//
// The watch parks in the runtime's poller (RawConn.Read) and looks again at each event on the
// socket, so it costs no thread and no polling: every segment that arrives, the FIN included,
// wakes it once. The read loop is waiting meanwhile, so nothing else reads the socket.
func watchHangup(raw net.Conn) (gone <-chan struct{}, stop func()) {
	tc := tcpOf(raw)
	if tc == nil {
		return nil, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, nil
	}
	hung, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		if rc.Read(func(fd uintptr) bool { return hungUp(int(fd)) }) == nil {
			close(hung)
		}
	}()
	return hung, func() {
		tc.SetReadDeadline(time.Unix(1, 0)) // past: the watch's wait returns
		<-ended
		tc.SetReadDeadline(time.Time{})
	}
}

// hungUp reports whether fd's peer has closed its side (or reset it), whatever unread bytes wait.
func hungUp(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}
