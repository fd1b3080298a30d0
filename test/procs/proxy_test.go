package procs_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/wardenhq/warden/test/procs"
)

// echoServer echoes every connection and reports each one's end on ended.
func echoServer(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
				ch <- struct{}{}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func dial(t *testing.T, p *procs.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// echo writes s and reads it back within a second.
func echo(c net.Conn, s string) error {
	if _, err := c.Write([]byte(s)); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	defer c.SetReadDeadline(time.Time{})
	b := make([]byte, len(s))
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != s {
		return errors.New("echoed " + string(b))
	}
	return nil
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestProxyBlackholeHoldsBytesAndClosesUntilHeal(t *testing.T) {
	t.Parallel()
	addr, ended := echoServer(t)
	p := procs.StartProxy(t, addr)
	c := dial(t, p)
	if err := echo(c, "before"); err != nil {
		t.Fatal(err)
	}
	if !p.Blackhole() || p.Blackhole() {
		t.Fatal("Blackhole: want true, then false while in force")
	}
	if _, err := c.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the write held", func() bool { return p.Stats().HeldToServer == 1 })
	// The connection stays open and silent: a read times out, no close.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read during the blackhole: %v, want a timeout", err)
	}
	// A new connection never reaches the server and is closed at Heal.
	late := dial(t, p)
	waitUntil(t, "the new connection held", func() bool { return p.Stats().Unsent == 1 })
	p.Heal()
	b := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "held" {
		t.Fatalf("after Heal read %q, %v; want the held bytes", b, err)
	}
	_ = late.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := late.Read(b); err != io.EOF {
		t.Fatalf("connection opened during the blackhole: read %v after Heal, want EOF", err)
	}

	// A client that closes during a blackhole closes the server's side
	// only at Heal.
	p.Blackhole()
	_ = c.Close()
	waitUntil(t, "the close held", func() bool { return p.Stats().HeldToServer == 2 })
	select {
	case <-ended:
		t.Fatal("the server saw the close during the blackhole")
	default:
	}
	p.Heal()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the close after Heal")
	}
	if s := p.Stats(); s.Forwarded != 1 || s.Unsent != 1 {
		t.Fatalf("stats %+v: want 1 forwarded, 1 unsent", s)
	}
}

func TestProxyCutClosesAndRefusesUntilHeal(t *testing.T) {
	t.Parallel()
	addr, ended := echoServer(t)
	p := procs.StartProxy(t, addr)
	c := dial(t, p)
	if err := echo(c, "x"); err != nil {
		t.Fatal(err)
	}
	if !p.Cut() || !p.Partitioned() {
		t.Fatal("Cut did not take effect")
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after Cut: %v, want EOF", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the server's side was not closed by Cut")
	}
	refused := dial(t, p)
	_ = refused.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := refused.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection during the cut: read %v, want EOF", err)
	}
	p.Heal()
	if err := echo(dial(t, p), "after"); err != nil {
		t.Fatalf("after Heal: %v", err)
	}
	if s := p.Stats(); s.Severed != 1 || s.Refused != 1 || s.Forwarded != 2 {
		t.Fatalf("stats %+v: want 1 severed, 1 refused, 2 forwarded", s)
	}
}
