package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"sort"

	"github.com/wardenhq/warden/pkg/protocol"
)

// Sections of a ClusterSync.
const (
	SectionAssignedTargets = "assigned_targets"
	SectionTaskStates      = "task_states"
	SectionConfiguration   = "configuration"
	SectionCachedDigests   = "cached_digests"
)

var sections = []string{SectionAssignedTargets, SectionTaskStates, SectionConfiguration, SectionCachedDigests}

// Change is one entry of a diff: set Section[Key] = Value, or delete it.
type Change struct {
	Section string `json:"section"`
	Key     string `json:"key"`
	Value   string `json:"value,omitempty"`
	Delete  bool   `json:"delete,omitempty"`
}

func section(s *protocol.ClusterSync, name string) *map[string]string {
	switch name {
	case SectionAssignedTargets:
		return &s.AssignedTargets
	case SectionTaskStates:
		return &s.TaskStates
	case SectionConfiguration:
		return &s.Configuration
	case SectionCachedDigests:
		return &s.CachedDigests
	}
	return nil
}

// Diff returns the changes that turn from into to, in a stable order
// (section, then key).
func Diff(from, to protocol.ClusterSync) []Change {
	var out []Change
	for _, name := range sections {
		a, b := *section(&from, name), *section(&to, name)
		var keys []string
		for k := range a {
			if _, ok := b[k]; !ok {
				keys = append(keys, k)
			}
		}
		for k, v := range b {
			if old, ok := a[k]; !ok || old != v {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			if v, ok := b[k]; ok {
				out = append(out, Change{Section: name, Key: k, Value: v})
			} else {
				out = append(out, Change{Section: name, Key: k, Delete: true})
			}
		}
	}
	return out
}

// Apply returns s with the changes applied; s itself is not modified.
// Leader, Epoch and CapturedAt are the caller's to set; Digest is
// recomputed.
func Apply(s protocol.ClusterSync, changes []Change) protocol.ClusterSync {
	out := s
	for _, name := range sections {
		p := section(&out, name)
		*p = maps.Clone(*p)
	}
	for _, c := range changes {
		p := section(&out, c.Section)
		if p == nil {
			continue
		}
		if c.Delete {
			delete(*p, c.Key)
			continue
		}
		if *p == nil {
			*p = map[string]string{}
		}
		(*p)[c.Key] = c.Value
	}
	out.Digest = Digest(out)
	return out
}

// Digest is the SHA-256 (hex, first 16 bytes) of the four sections: each
// non-empty entry as section \x00 key \x00 value \n, sections in the order
// assigned_targets, task_states, configuration, cached_digests, keys
// sorted. Leader, epoch and capture time are not part of it: two members
// with the same content have the same digest.
func Digest(s protocol.ClusterSync) string {
	h := sha256.New()
	for _, name := range sections {
		m := *section(&s, name)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			h.Write([]byte(name + "\x00" + k + "\x00" + m[k] + "\n"))
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}
