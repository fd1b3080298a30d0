package cluster

import (
	"hash/fnv"
	"sort"
)

// Owner returns the member that owns target among members: rendezvous
// (highest random weight) hashing. Every member m gets the weight
// FNV-1a-64(m + "\x00" + target) mixed by a 64-bit finaliser, and the
// highest weight wins (ties: the smaller key). Any client can compute it,
// and when a member leaves only its own targets move; when one joins it
// takes only the targets it now wins. Owner returns "" without members.
func Owner(target string, members []string) string {
	best, bestW := "", uint64(0)
	for _, m := range members {
		w := weight(m, target)
		if best == "" || w > bestW || (w == bestW && m < best) {
			best, bestW = m, w
		}
	}
	return best
}

func weight(member, target string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(member))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(target))
	return mix64(h.Sum64())
}

// mix64 is the splitmix64 finaliser: FNV alone weights similar keys
// similarly, which skews the assignment.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Assign maps every target to its Owner among members.
func Assign(targets, members []string) map[string]string {
	out := make(map[string]string, len(targets))
	if len(members) == 0 {
		return out
	}
	for _, t := range targets {
		out[t] = Owner(t, members)
	}
	return out
}

// TargetsOf returns the targets assigned to member, sorted.
func TargetsOf(assignment map[string]string, member string) []string {
	var out []string
	for t, m := range assignment {
		if m == member {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// Moved returns the targets whose owner differs between two assignments,
// sorted.
func Moved(before, after map[string]string) []string {
	var out []string
	for t, m := range after {
		if before[t] != m {
			out = append(out, t)
		}
	}
	for t := range before {
		if _, ok := after[t]; !ok {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}
