package client

// SetHeldHook has Cancel run f between finding a held submission and
// creating its cancelled records, until the returned func removes it.
func SetHeldHook(f func(job string)) (restore func()) {
	testHookHeld.Store(&f)
	return func() { testHookHeld.Store(nil) }
}
