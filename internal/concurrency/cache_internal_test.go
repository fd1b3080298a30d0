package concurrency

// cachedKeys is how many keys l keeps state for.
func cachedKeys(l *Limiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}
