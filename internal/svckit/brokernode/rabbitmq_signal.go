package brokernode

import (
	"errors"
	"fmt"
	"syscall"
)

// This file freezes and thaws a private node: a hung broker, for tests
// that need one silent rather than gone.

// Freeze stops every process of the node (SIGSTOP to its process group), as
// a hung broker: its sockets stay open, and it neither reads nor sends,
// heartbeats included. Thaw resumes it.
func (r *RabbitMQ) Freeze() error { return r.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen node (SIGCONT).
func (r *RabbitMQ) Thaw() error { return r.signal(syscall.SIGCONT) }

func (r *RabbitMQ) signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proc == nil {
		return errors.New("rabbitmq node is not running")
	}
	// The negative pid is the node's own process group (Setpgid above).
	if err := syscall.Kill(-r.proc.Process.Pid, sig); err != nil {
		return fmt.Errorf("signal rabbitmq node %s: %w", r.node, err)
	}
	return nil
}
