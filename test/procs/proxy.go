package procs

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback that processes reach a server through,
// so that a test can partition them from it without touching either end:
//
//   - Blackhole stops forwarding bytes both ways and keeps every connection
//     open, as across a real partition: neither end sees a close, their
//     pings go unanswered. What was in flight is held, not dropped (TCP
//     would retransmit it), and delivered at Heal, a close included: a
//     client that gave up on its connection meanwhile closes the server's
//     side only then. A connection opened during the blackhole never
//     reaches the server (a lost SYN) and is closed at Heal.
//   - Cut closes every connection at once and refuses new ones (closed on
//     accept, as a reset) until Heal.
//   - Heal ends either: bytes flow again, new connections reach the server.
//
// Only loopback: it listens on 127.0.0.1 and is for tests.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu      sync.Mutex
	cond    *sync.Cond // signalled when state changes or a connection closes
	state   proxyState
	conns   map[*proxyConn]struct{}
	unsent  []net.Conn // accepted during a blackhole; closed at Heal
	stats   ProxyStats
	closed  bool
	serving sync.WaitGroup
}

type proxyState int

const (
	proxyOpen proxyState = iota
	proxyBlackholed
	proxyCut
)

func (s proxyState) String() string {
	return [...]string{"open", "blackholed", "cut"}[s]
}

// ProxyStats counts what a proxy did since it started.
type ProxyStats struct {
	// Accepted counts connections accepted, Forwarded those that reached
	// the server.
	Accepted, Forwarded int
	// HeldToServer and HeldToClient count reads held by a blackhole, one
	// per read that had to wait for Heal (a close included): how often a
	// side tried to talk and could not.
	HeldToServer, HeldToClient int
	// Unsent counts connections opened during a blackhole, Refused those
	// opened during a cut, Severed those closed by Cut.
	Unsent, Refused, Severed int
}

type proxyConn struct {
	client, server net.Conn
	closed         bool
}

// StartProxy starts a proxy to upstream (host:port); it is closed when the
// test ends, after the processes started later (cleanups run last first).
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	p, err := NewProxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// NewProxy listens on a free loopback port and forwards to upstream.
func NewProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{upstream: upstream, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.serving.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stats returns the counts so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Partitioned reports whether a blackhole or a cut is in force.
func (p *Proxy) Partitioned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state != proxyOpen
}

// Blackhole holds every byte both ways until Heal. It returns false, and
// does nothing, if a partition is already in force.
func (p *Proxy) Blackhole() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != proxyOpen || p.closed {
		return false
	}
	p.state = proxyBlackholed
	return true
}

// Cut closes every connection and refuses new ones until Heal. It returns
// false, and does nothing, if a partition is already in force.
func (p *Proxy) Cut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != proxyOpen || p.closed {
		return false
	}
	p.state = proxyCut
	for c := range p.conns {
		p.closeLocked(c)
		p.stats.Severed++
	}
	return true
}

// Heal ends a blackhole or a cut.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = proxyOpen
	for _, c := range p.unsent {
		_ = c.Close()
	}
	p.unsent = nil
	p.cond.Broadcast()
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for c := range p.conns {
			p.closeLocked(c)
		}
		for _, c := range p.unsent {
			_ = c.Close()
		}
		p.unsent = nil
	}
	p.mu.Unlock()
	p.serving.Wait()
}

func (p *Proxy) closeLocked(c *proxyConn) {
	if c.closed {
		return
	}
	c.closed = true
	_ = c.client.Close()
	_ = c.server.Close()
	delete(p.conns, c)
	p.cond.Broadcast()
}

func (p *Proxy) accept() {
	defer p.serving.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.stats.Accepted++
		switch {
		case p.closed:
			_ = c.Close()
		case p.state == proxyCut:
			p.stats.Refused++
			_ = c.Close()
		case p.state == proxyBlackholed:
			p.stats.Unsent++
			p.unsent = append(p.unsent, c)
		default:
			p.serving.Add(1)
			go p.connect(c)
		}
		p.mu.Unlock()
	}
}

// connect dials the server for client and forwards both ways.
func (p *Proxy) connect(client net.Conn) {
	defer p.serving.Done()
	server, err := net.DialTimeout("tcp", p.upstream, 2*time.Second)
	if err != nil {
		_ = client.Close() // the server is down: the client sees a close and retries
		return
	}
	c := &proxyConn{client: client, server: server}
	p.mu.Lock()
	if p.closed || p.state == proxyCut {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.stats.Forwarded++
	p.serving.Add(2)
	p.mu.Unlock()
	go p.pipe(c, client, server, &p.stats.HeldToServer)
	go p.pipe(c, server, client, &p.stats.HeldToClient)
}

// pipe copies src to dst, each read waiting out a blackhole before it is
// written; src's end (EOF or error) waits too, then closes both sides.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn, held *int) {
	defer p.serving.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass(c, held) {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	p.closeLocked(c)
	p.mu.Unlock()
}

// pass waits while a blackhole is in force and reports whether c is still
// open; a read that had to wait is counted in held.
func (p *Proxy) pass(c *proxyConn, held *int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == proxyBlackholed && !c.closed {
		*held++
	}
	for p.state == proxyBlackholed && !c.closed {
		p.cond.Wait()
	}
	return !c.closed
}
