package api

import "time"

// SetSSEWriteTimeout sets the event stream's write timeout for a test and
// returns the function that restores it.
func SetSSEWriteTimeout(d time.Duration) func() {
	old := sseWriteTimeout
	sseWriteTimeout = d
	return func() { sseWriteTimeout = old }
}

// OpenStreams is how many event streams s serves now.
func (s *Server) OpenStreams() int64 { return s.streams.Load() }

// SetIdleTimeout sets how long Run keeps an idle keep-alive connection;
// call it before Run.
func (s *Server) SetIdleTimeout(d time.Duration) { s.idleTimeout = d }
