package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// TypedRequestVersion is the published library version the peers run (pinned in install.sh).
const TypedRequestVersion = "3.3.0"

// Ready reports whether the peers can run from dir (the interop directory): node on PATH and the
// packages install.sh puts in place. Its error names the one command that would make the suite
// run: installing Node.js and npm where node is missing, else `bash interop/install.sh`.
func Ready(dir string) error {
	const install = "bash interop/install.sh"
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("interop: node is not on PATH; to run this suite: apt-get install nodejs npm && %s (Node.js ≥ 18)", install)
	}
	for _, f := range []string{
		"node_modules/ws/package.json",
		"node_modules/@api.global/typedrequest/.interop-" + TypedRequestVersion,
		"node_modules/@api.global/typedrequest/dist_bundle/bundle.js",
	} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			how := install
			if _, err := exec.LookPath("npm"); err != nil {
				how = "apt-get install npm && " + install
			}
			return fmt.Errorf("interop: the peers' packages are not installed (%s is missing); to run this suite: %s", f, how)
		}
	}
	return nil
}

// Dir finds the interop directory from the working directory: this package's own directory
// under `go test`, the module root under `go run ./bench`.
func Dir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "interop"), nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("interop: no go.mod above the working directory")
		}
	}
}

// Event is an unsolicited line from a peer process ({ event, … }).
type Event map[string]any

type reply struct {
	OK     bool            `json:"ok"`
	Result json.RawMessage `json:"result"`
	Error  string          `json:"error"`
}

// proc is one Node.js peer process and its command channel: commands on its standard input,
// answers and events on its standard output, one JSON object a line.
type proc struct {
	name  string         // set at construction
	cmd   *exec.Cmd      // set at construction
	stdin io.WriteCloser // set at construction; writes under writeMu
	tail  *Tail          // set at construction: the end of its standard error
	done  chan struct{}  // closed when standard output ended (the process is exiting)

	writeMu sync.Mutex // one command line at a time

	mu      sync.Mutex
	nextID  int64                // guarded by mu
	waiting map[int64]chan reply // guarded by mu
	events  chan Event           // buffered; events beyond its room are dropped
}

// start runs `node script args…` in dir and waits for its first event, which must be named
// ready.
func start(ctx context.Context, dir, name, script string, args ...string) (*proc, Event, error) {
	cmd := exec.Command("node", append([]string{filepath.Join(dir, "peers", script)}, args...)...)
	cmd.Dir = dir
	dieWithParent(cmd)
	p := &proc{name: name, cmd: cmd, tail: NewTail(64 << 10), done: make(chan struct{}),
		waiting: make(map[int64]chan reply), events: make(chan Event, 64)}
	cmd.Stderr = p.tail
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	p.stdin = stdin
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("interop: start %s: %w", name, err)
	}
	go p.readLoop(stdout)
	if script == "nodes.mjs" {
		return p, nil, nil // it has nothing to announce
	}
	select {
	case ev := <-p.events:
		if ev["event"] != "ready" {
			p.Close()
			return nil, nil, fmt.Errorf("interop: %s announced %v before ready", name, ev)
		}
		return p, ev, nil
	case <-p.done:
		p.Close()
		return nil, nil, fmt.Errorf("interop: %s exited at start: %s", name, p.tail.String())
	case <-ctx.Done():
		p.Close()
		return nil, nil, fmt.Errorf("interop: %s did not start: %w", name, ctx.Err())
	}
}

func (p *proc) readLoop(stdout io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var line struct {
			ID    *int64 `json:"id"`
			Event string `json:"event"`
		}
		if json.Unmarshal(sc.Bytes(), &line) != nil {
			continue
		}
		if line.ID == nil {
			var ev Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				select {
				case p.events <- ev:
				default:
				}
			}
			continue
		}
		var r reply
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			r = reply{Error: "unreadable answer line"}
		}
		p.mu.Lock()
		ch := p.waiting[*line.ID]
		delete(p.waiting, *line.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// do runs one command and decodes its result into out (when out is not nil).
func (p *proc) do(ctx context.Context, cmd string, args, out any) error {
	ch := make(chan reply, 1)
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	p.waiting[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
	}()
	line, err := json.Marshal(map[string]any{"id": id, "cmd": cmd, "args": args})
	if err != nil {
		return err
	}
	p.writeMu.Lock()
	_, err = p.stdin.Write(append(line, '\n'))
	p.writeMu.Unlock()
	if err != nil {
		return fmt.Errorf("interop: %s %s: %w", p.name, cmd, err)
	}
	select {
	case r := <-ch:
		if !r.OK {
			return fmt.Errorf("interop: %s %s: %s", p.name, cmd, r.Error)
		}
		if out == nil {
			return nil
		}
		return json.Unmarshal(r.Result, out)
	case <-p.done:
		return fmt.Errorf("interop: %s exited during %s", p.name, cmd)
	case <-ctx.Done():
		return fmt.Errorf("interop: %s %s: %w", p.name, cmd, ctx.Err())
	}
}

// Events delivers the process's unsolicited lines.
func (p *proc) Events() <-chan Event { return p.events }

// Stderr is the end of what the process wrote to standard error (the library's console).
func (p *proc) Stderr() string { return p.tail.String() }

// Close ends the process: standard input closed (it exits on that), killed after 5 s.
func (p *proc) Close() {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
	}
	p.cmd.Wait()
}

// Tail keeps the last bytes written to it.
type Tail struct {
	mu  sync.Mutex
	max int
	buf []byte // guarded by mu
}

// NewTail keeps the last max bytes.
func NewTail(max int) *Tail { return &Tail{max: max} }

func (t *Tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.mu.Unlock()
	return len(b), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
