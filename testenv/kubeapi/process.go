package kubeapi

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/kubernetes"
)

// Process is the same control plane as Start's, owned by a process rather than a test (`relay
// dev --replicas`): its methods return errors where the Server's fail the test, and Stop removes
// its temporary directory.
type Process struct {
	s *Server // set at construction
}

// StartProcess starts etcd, then kube-apiserver, from the binaries Binaries names, and waits
// until the API server answers /readyz. Without the binaries it fails naming BuildCommand; when a
// process does not become ready, the error carries the last lines of its log. The caller must
// Stop it.
func StartProcess() (*Process, error) {
	bin, ok := Binaries()
	if !ok {
		return nil, fmt.Errorf("kube-apiserver and etcd are not built in %s; build them with: %s", bin, BuildCommand)
	}
	dir, err := os.MkdirTemp("", "relay-kubeapi-")
	if err != nil {
		return nil, err
	}
	s, err := newServer(bin, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &Process{s: s}
	if _, _, err := s.start(); err != nil {
		logs := fmt.Sprintf("\nlast lines of %s:\n%s\nlast lines of %s:\n%s", s.etcdLog, tail(s.etcdLog, 10), s.apiLog, tail(s.apiLog, 10))
		return nil, errors.Join(fmt.Errorf("kubeapi: %w%s", err, logs), p.Stop())
	}
	return p, nil
}

// Stop kills kube-apiserver and etcd, reaps both and removes the temporary directory; later
// calls do nothing.
func (p *Process) Stop() error {
	err := p.s.stop()
	if rmErr := os.RemoveAll(p.s.dir); err == nil {
		err = rmErr
	}
	return err
}

// PauseAPIServer is Server.PauseAPIServer; ResumeAPIServer is Server.ResumeAPIServer.
func (p *Process) PauseAPIServer() error  { return p.s.signalAPIServer(syscall.SIGSTOP) }
func (p *Process) ResumeAPIServer() error { return p.s.signalAPIServer(syscall.SIGCONT) }

// URL is the API server's address.
func (p *Process) URL() string { return fmt.Sprintf("https://127.0.0.1:%d", p.s.port) }

// Kubeconfig is Server.Kubeconfig.
func (p *Process) Kubeconfig(user string) (string, error) { return p.s.kubeconfig(user) }

// Client is Server.Client.
func (p *Process) Client(user string) (kubernetes.Interface, error) { return p.s.client(user) }

// SetupNamespace is Server.SetupNamespace.
func (p *Process) SetupNamespace(ns string, rules ...rbacv1.PolicyRule) error {
	return p.s.setupNamespace(ns, rules)
}

// CreatePod is Server.CreatePod.
func (p *Process) CreatePod(ns, name, podIP string) (*corev1.Pod, error) {
	return p.s.createPod(ns, name, podIP)
}
