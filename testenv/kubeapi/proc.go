package kubeapi

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one child process: etcd or kube-apiserver.
type proc struct {
	name string        // owner: start; "etcd" or "kube-apiserver", for messages
	cmd  *exec.Cmd     // owner: start; the started process, its own process group
	done chan struct{} // owner: the waiting goroutine; closed once the process has been reaped
	err  error         // owner: the waiting goroutine; Wait's result, readable after done
}

// start runs bin with args, appending its stdout and stderr to logPath.
func start(name, bin string, args []string, logPath string) (*proc, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// kill ends the process group with SIGKILL and reaps the process. A test fixture needs no
// graceful shutdown: etcd's data survives a kill, and a killed API server frees its port at once.
func (p *proc) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) not reaped 10 s after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// signal sends sig to the process group, unless the process has been reaped.
func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("%s has exited", p.name)
	default:
	}
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// waitReady polls ready every 50 ms until it succeeds, the process exits or ctx ends.
func (p *proc) waitReady(ctx context.Context, ready func(context.Context) error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready: %v", p.name, p.err)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %v (last check: %v)", p.name, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// rssKiB is the process's resident set size from /proc, or 0 where there is none.
func (p *proc) rssKiB() int {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kib int
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kib)
			return kib
		}
	}
	return 0
}

// freePorts returns n distinct loopback TCP ports that nothing listens on now, taken below the
// kernel's ephemeral range: a port the kernel hands out for a listener on port 0 or an outgoing
// connection (in any process) can then never be one of these between the pick and the child's
// bind. Each is held while the others are picked, so etcd's two ports and the API server's
// differ. Another Server picking at the same moment is the one collision left; the child then
// fails at start, which the test reports with its log.
func freePorts(n int) ([]int, error) {
	low := ephemeralLow()
	var ports []int
	for try := 0; len(ports) < n && try < 1000; try++ {
		port := 1024 + rand.IntN(low-1024)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		defer l.Close()
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("no %d free loopback ports below %d", n, low)
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range, or Linux's default when
// /proc does not say.
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return linuxDefault
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low < 1024+1000 {
		return linuxDefault
	}
	return low
}

// tail returns the last n lines of a log file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
