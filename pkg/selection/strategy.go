package selection

// pick applies the pool's strategy to the available agents; nil when the
// strategy finds every allowed agent full.
func (s *Selector) pick(available []candidate, req Request) *candidate {
	strategy := s.cfg.strategyOf(req.Pool)
	if req.Agent != "" {
		strategy = StrategyScore // one agent: nothing to choose
	}
	switch strategy {
	case StrategyStandby:
		primary := &available[0]
		for i := range available {
			if available[i].p.ID < primary.p.ID {
				primary = &available[i]
			}
		}
		if primary.full() {
			return nil
		}
		return primary
	case StrategyRoundRobin:
		last := s.cursor[req.Pool]
		var first, next *candidate // lowest id overall, lowest id after last
		for i := range available {
			c := &available[i]
			if c.full() {
				continue
			}
			if first == nil || c.p.ID < first.p.ID {
				first = c
			}
			if c.p.ID > last && (next == nil || c.p.ID < next.p.ID) {
				next = c
			}
		}
		if next == nil {
			next = first
		}
		if next != nil {
			s.cursor[req.Pool] = next.p.ID
		}
		return next
	case StrategyLeastLoaded:
		return best(available, func(a, b *candidate) int {
			if la, lb := a.load(), b.load(); la != lb {
				return cmpFloat(lb, la) // lower load is better
			}
			return cmpFloat(a.factor, b.factor)
		})
	case StrategyAffinity:
		if want := s.affinity(req); len(want) > 0 {
			matching := best(available, func(a, b *candidate) int {
				if ma, mb := hasLabels(a.p.Labels, want), hasLabels(b.p.Labels, want); ma != mb {
					if ma {
						return 1
					}
					return -1
				}
				return byScore(a, b)
			})
			return matching
		}
	}
	return best(available, byScore)
}

// byScore prefers the higher score, then the lower load.
func byScore(a, b *candidate) int {
	if sa, sb := a.score(), b.score(); sa != sb {
		return cmpFloat(sa, sb)
	}
	return cmpFloat(b.load(), a.load())
}

func cmpFloat(a, b float64) int {
	switch {
	case a > b:
		return 1
	case a < b:
		return -1
	}
	return 0
}

// best returns the candidate that is not full and that cmp ranks highest
// (cmp(a, b) > 0: a is better); among equals the lowest id. nil when all
// are full.
func best(cs []candidate, cmp func(a, b *candidate) int) *candidate {
	var b *candidate
	for i := range cs {
		c := &cs[i]
		if c.full() {
			continue
		}
		if b == nil {
			b = c
			continue
		}
		if r := cmp(c, b); r > 0 || (r == 0 && c.p.ID < b.p.ID) {
			b = c
		}
	}
	return b
}

// affinity returns the labels wanted for req: the pool's, overridden by the
// request's.
func (s *Selector) affinity(req Request) map[string]string {
	want := map[string]string{}
	for k, v := range s.cfg.Pools[req.Pool].Affinity {
		want[k] = v
	}
	for k, v := range req.Labels {
		want[k] = v
	}
	return want
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
