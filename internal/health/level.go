package health

import (
	"fmt"
	"strings"
)

// Level is an assessed health level. Larger is worse; the zero value is
// Unknown (never assessed).
type Level uint8

// Levels, best first.
const (
	Unknown Level = iota
	Healthy
	Degraded
	Warning
	Critical
	Failed
)

var levelNames = [...]string{"unknown", "healthy", "degraded", "warning", "critical", "failed"}

// Levels lists the assessed levels, best first (Unknown excluded).
func Levels() []Level { return []Level{Healthy, Degraded, Warning, Critical, Failed} }

func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return fmt.Sprintf("level(%d)", uint8(l))
}

// ParseLevel reads a level name ("healthy", "critical", ...).
func ParseLevel(s string) (Level, error) {
	for i, n := range levelNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return Level(i), nil
		}
	}
	return Unknown, fmt.Errorf("unknown health level %q (want one of %s)", s, strings.Join(levelNames[1:], ", "))
}

// MarshalText writes the level's name, in JSON and YAML alike.
func (l Level) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText reads a level's name.
func (l *Level) UnmarshalText(b []byte) error {
	v, err := ParseLevel(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// Worse reports whether l is a worse level than o. Unknown (never
// assessed) compares as Healthy.
func (l Level) Worse(o Level) bool { return l.rank() > o.rank() }

func (l Level) rank() Level {
	if l == Unknown {
		return Healthy
	}
	return l
}

// worst returns the worse of two levels.
func worst(a, b Level) Level {
	if b.Worse(a) {
		return b
	}
	return a
}
