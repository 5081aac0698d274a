package netproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// proxyDialTimeout bounds connecting to the proxy's target.
const proxyDialTimeout = 5 * time.Second

// direction of a byte stream through the proxy.
type direction int

const (
	upstream   direction = iota // client -> target
	downstream                  // target -> client
)

// Proxy is a TCP proxy on 127.0.0.1 that forwards to one target and can
// stall, black-hole or cut the traffic, to test how PostgreSQL and RabbitMQ
// clients cope with network faults.
//
// Holds and the blackhole apply to current and future connections. While a
// direction is held, the proxy stops reading that side beyond one buffered
// chunk, so bytes queue up (in the kernel and the proxy) and are delivered in
// order once released; the sender sees no error, as with a stalled network.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu     sync.Mutex
	cond   *sync.Cond // signalled whenever a gate or a link's state changes
	holdUp bool
	// holdUpIf, when set, limits holdUp to the links whose first chunk
	// from the client (for PostgreSQL, the startup message) it accepts.
	holdUpIf  func(first []byte) bool
	holdDown  bool
	blackhole bool
	closed    bool
	links     map[*proxyLink]struct{}

	// rate limits client->target bytes per second (0: unlimited).
	rate atomic.Int64
}

// rateChunk is the largest write while a rate is set: the proxy sleeps
// after each chunk for the time the rate allots it, so traffic trickles
// instead of arriving in 32 KiB bursts.
const rateChunk = 4096

// proxyLink is one client connection and its connection to the target.
type proxyLink struct {
	client net.Conn
	server net.Conn // nil until dialled
	dead   bool     // guarded by Proxy.mu; set when Reset or Close cut it
	first  []byte   // the client's first chunk; guarded by Proxy.mu
}

// NewProxy listens on a free 127.0.0.1 port and forwards every connection to
// target ("host:port").
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("new proxy to %s: listen: %w", target, err)
	}
	p := &Proxy{target: target, ln: ln, links: make(map[*proxyLink]struct{})}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// SetRate limits client->target traffic, on current and future
// connections, to bytesPerSecond (0: unlimited), to make a server slow to
// take what it is sent: a broker slow to take publishes is slow to confirm
// them.
func (p *Proxy) SetRate(bytesPerSecond int64) { p.rate.Store(bytesPerSecond) }

// Addr is the "127.0.0.1:PORT" clients should connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// HoldDownstream stops (true) or resumes (false) forwarding target->client
// bytes. Held bytes are kept and delivered in order on resume.
func (p *Proxy) HoldDownstream(hold bool) { p.setGate(func() { p.holdDown = hold }) }

// HoldUpstream stops (true) or resumes (false) forwarding client->target
// bytes. Held bytes are kept and delivered in order on resume.
func (p *Proxy) HoldUpstream(hold bool) {
	p.setGate(func() { p.holdUp, p.holdUpIf = hold, nil })
}

// HoldUpstreamWhere holds client->target bytes (as HoldUpstream(true)) only
// on the links whose first chunk from the client match accepts: for
// PostgreSQL that chunk is the startup message, so a test can hold the
// replication connection (its startup names "replication") and let the
// others through. HoldUpstream(false) resumes them.
func (p *Proxy) HoldUpstreamWhere(match func(first []byte) bool) {
	p.setGate(func() { p.holdUp, p.holdUpIf = true, match })
}

// Blackhole simulates a network partition: nothing moves in either direction
// and neither side gets an error (no RST, no FIN). New connections are
// accepted but not connected to the target until the blackhole is lifted.
// As with TCP retransmission after a partition heals, bytes sent meanwhile
// are delivered when it is lifted; to kill the connections, call Reset.
func (p *Proxy) Blackhole(on bool) { p.setGate(func() { p.blackhole = on }) }

// Reset abruptly closes all current connections, with an RST to both the
// client and the target (SO_LINGER 0). New connections work as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		p.killLocked(l)
	}
}

// ActiveConns is the number of client connections currently proxied.
func (p *Proxy) ActiveConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops listening, resets all connections and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for l := range p.links {
		p.killLocked(l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("close proxy: %w", err)
	}
	return nil
}

func (p *Proxy) setGate(set func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set()
	p.cond.Broadcast()
}

// killLocked closes both ends of a link with an RST. p.mu must be held.
func (p *Proxy) killLocked(l *proxyLink) {
	if l.dead {
		return
	}
	l.dead = true
	delete(p.links, l)
	abort(l.client)
	if l.server != nil {
		abort(l.server)
	}
	p.cond.Broadcast()
}

// abort closes c so that the peer gets an RST rather than a FIN.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		l := &proxyLink{client: client}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			abort(client)
			return
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(l)
	}
}

// serve connects a link to the target (once no blackhole is in the way) and
// pumps both directions until both are finished or the link is killed.
func (p *Proxy) serve(l *proxyLink) {
	defer p.wg.Done()
	if !p.waitForPath(l) {
		return
	}
	server, err := net.DialTimeout("tcp", p.target, proxyDialTimeout)
	if err != nil {
		// The target is down: make the client see a refused-like failure.
		p.mu.Lock()
		p.killLocked(l)
		p.mu.Unlock()
		return
	}
	p.mu.Lock()
	if l.dead {
		p.mu.Unlock()
		abort(server)
		return
	}
	l.server = server
	p.mu.Unlock()

	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); p.pump(l, upstream, l.client, server) }()
	go func() { defer pumps.Done(); p.pump(l, downstream, server, l.client) }()
	pumps.Wait()

	p.mu.Lock()
	if !l.dead {
		l.dead = true
		delete(p.links, l)
	}
	p.mu.Unlock()
	_ = l.client.Close()
	_ = server.Close()
}

// waitForPath blocks while the proxy is black-holed; false means the link
// was killed meanwhile.
func (p *Proxy) waitForPath(l *proxyLink) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.blackhole && !l.dead {
		p.cond.Wait()
	}
	return !l.dead
}

// pump copies src to dst, pausing before each write while dir is held.
// A clean EOF is passed on as a half-close so protocols that shut down one
// side first still work; any error cuts the whole link.
func (p *Proxy) pump(l *proxyLink, dir direction, src, dst net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		// While a rate is set, read no more than is written before the
		// next pause, so the proxy holds no extra backlog of its own.
		chunk := buf
		if dir == upstream && p.rate.Load() > 0 {
			chunk = buf[:rateChunk]
		}
		n, rerr := src.Read(chunk)
		if n > 0 {
			if dir == upstream {
				p.noteFirst(l, buf[:n])
			}
			if !p.waitGate(l, dir) {
				return
			}
			if werr := p.write(dir, dst, buf[:n]); werr != nil {
				p.cut(l)
				return
			}
		}
		if rerr == nil {
			continue
		}
		if errors.Is(rerr, io.EOF) {
			if !p.waitGate(l, dir) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
		p.cut(l)
		return
	}
}

// write sends chunk to dst; upstream, while a rate is set, in pieces of
// rateChunk with a pause after each.
func (p *Proxy) write(dir direction, dst net.Conn, chunk []byte) error {
	for len(chunk) > 0 {
		r := p.rate.Load()
		if dir != upstream || r <= 0 {
			_, err := dst.Write(chunk)
			return err
		}
		n := min(len(chunk), rateChunk)
		if _, err := dst.Write(chunk[:n]); err != nil {
			return err
		}
		time.Sleep(time.Duration(int64(n) * int64(time.Second) / r))
		chunk = chunk[n:]
	}
	return nil
}

// waitGate blocks while dir is held or black-holed; false means the link was
// killed meanwhile.
func (p *Proxy) waitGate(l *proxyLink, dir direction) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !l.dead && p.gateClosedLocked(l, dir) {
		p.cond.Wait()
	}
	return !l.dead
}

// noteFirst records the client's first chunk of l.
func (p *Proxy) noteFirst(l *proxyLink, chunk []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.first == nil {
		l.first = append([]byte(nil), chunk...)
	}
}

func (p *Proxy) gateClosedLocked(l *proxyLink, dir direction) bool {
	if p.blackhole {
		return true
	}
	if dir == upstream {
		return p.holdUp && (p.holdUpIf == nil || p.holdUpIf(l.first))
	}
	return p.holdDown
}

// cut propagates a failure on one side as an RST on the other.
func (p *Proxy) cut(l *proxyLink) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killLocked(l)
}
