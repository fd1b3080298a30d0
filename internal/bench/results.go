package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Figure is one measured value.
type Figure struct {
	Section string
	Key     string // flat key in latest.json
	Label   string
	Value   float64
	Unit    string
	// Target is the goal printed beside the figure (never asserted).
	Target string
	// Met says whether the target is met: "yes", "no" or "" (no target).
	Met string
	// Note qualifies the figure (how it was measured, vs raw JetStream).
	Note string
}

// Report collects a run's figures and writes them out.
type Report struct {
	mu      sync.Mutex
	Figures []Figure
	Info    map[string]any // strings and numbers recorded as they are
	Notes   []string
}

// NewReport returns an empty report.
func NewReport() *Report { return &Report{Info: map[string]any{}} }

// Add records a figure.
func (r *Report) Add(f Figure) {
	if math.IsNaN(f.Value) || math.IsInf(f.Value, 0) {
		f.Value = 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.Figures {
		if r.Figures[i].Key == f.Key {
			r.Figures[i] = f
			return
		}
	}
	r.Figures = append(r.Figures, f)
}

// Set records a value that is not a figure (machine, settings, methods).
func (r *Report) Set(key string, v any) {
	r.mu.Lock()
	r.Info[key] = v
	r.mu.Unlock()
}

// Note records a remark printed under the table.
func (r *Report) Note(format string, args ...any) {
	r.mu.Lock()
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// Value returns a recorded figure's value.
func (r *Report) Value(key string) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.Figures {
		if f.Key == key {
			return f.Value, true
		}
	}
	return 0, false
}

// target helpers: atLeast / atMost fill Target and Met.
func atLeast(f Figure, goal float64, unit string) Figure {
	f.Target = fmt.Sprintf(">= %s %s", num(goal), unit)
	f.Met = yesNo(f.Value >= goal)
	return f
}

func atMost(f Figure, goal float64, unit string) Figure {
	f.Target = fmt.Sprintf("<= %s %s", num(goal), unit)
	f.Met = yesNo(f.Value <= goal)
	return f
}

// below is atMost for targets the acceptance states as strictly less than
// the goal (p50 < 2 ms, dispatch p99 < 5 ms, jobs ls < 1 s, supervisor
// lead < 5 s, idle < 1 core, RSS < 1 GiB): a value equal to the goal is
// not met.
func below(f Figure, goal float64, unit string) Figure {
	f.Target = fmt.Sprintf("< %s %s", num(goal), unit)
	f.Met = yesNo(f.Value < goal)
	return f
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e12:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// Flat returns the latest.json object: every figure by key, then the info.
func (r *Report) Flat() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]any{}
	for k, v := range r.Info {
		out[k] = v
	}
	for _, f := range r.Figures {
		out[f.Key] = round(f.Value)
	}
	if len(r.Notes) > 0 {
		out["notes"] = append([]string(nil), r.Notes...)
	}
	return out
}

func round(v float64) float64 {
	if v == 0 {
		return 0
	}
	digits := 4 - int(math.Floor(math.Log10(math.Abs(v))))
	if digits < 0 {
		digits = 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// WriteFiles writes <dir>/<stamp>.json, <dir>/<stamp>.bench.txt (benchstat
// format), <dir>/<stamp>.md (Markdown tables, with a before column from
// before when it is not nil) and <dir>/latest.json.
func (r *Report) WriteFiles(dir string, stamp time.Time, before map[string]any) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(r.Flat(), "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	name := stamp.UTC().Format("20060102T150405Z")
	paths := []string{filepath.Join(dir, name+".json"), filepath.Join(dir, "latest.json"), filepath.Join(dir, name+".bench.txt")}
	for _, p := range paths[:2] {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return nil, err
		}
	}
	f, err := os.Create(paths[2])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r.WriteBenchstat(f)
	md := filepath.Join(dir, name+".md")
	g, err := os.Create(md)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	r.WriteMarkdown(g, before)
	return append(paths, md), nil
}

// WriteBenchstat writes one line per figure in the Go benchmark format, so
// `benchstat old.bench.txt new.bench.txt` compares two runs.
func (r *Report) WriteBenchstat(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]string, 0, len(r.Info))
	for k := range r.Info {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if s, ok := r.Info[k].(string); ok && !strings.ContainsAny(s, "\n") {
			fmt.Fprintf(w, "%s: %s\n", strings.ReplaceAll(k, "_", "-"), s)
		}
	}
	for _, f := range r.Figures {
		unit := strings.ReplaceAll(f.Unit, " ", "")
		if unit == "" {
			unit = "x"
		}
		fmt.Fprintf(w, "BenchmarkWarden/%s 1 %g %s\n", f.Key, round(f.Value), unit)
	}
}

// Print writes the table: section, figure, value, target, met, note.
func (r *Report) Print(w io.Writer) {
	r.mu.Lock()
	figs := append([]Figure(nil), r.Figures...)
	notes := append([]string(nil), r.Notes...)
	r.mu.Unlock()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tFIGURE\tVALUE\tTARGET\tMET\tKEY / NOTE")
	section := ""
	for _, f := range figs {
		s := f.Section
		if s == section {
			s = ""
		} else {
			section = s
		}
		note := f.Key
		if f.Note != "" {
			note += "  (" + f.Note + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t%s\t%s\t%s\n", s, f.Label, num(f.Value), f.Unit, f.Target, f.Met, note)
	}
	_ = tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// percentile returns the p-th percentile (0..100) of ds, nearest rank.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// WriteMarkdown writes the figures as Markdown tables, one per section,
// for docs/performance.md: figure, before (the same key in before, a
// previous run's latest.json, when given), value, target, met, key.
func (r *Report) WriteMarkdown(w io.Writer, before map[string]any) {
	r.mu.Lock()
	figs := append([]Figure(nil), r.Figures...)
	notes := append([]string(nil), r.Notes...)
	rev, _ := r.Info["git_revision"].(string)
	dirty, hasDirty := r.Info["git_dirty"].(bool)
	r.mu.Unlock()
	if rev != "" {
		tree := ""
		if hasDirty && dirty {
			tree = " (uncommitted changes in the tree)"
		} else if hasDirty {
			tree = " (clean tree)"
		}
		fmt.Fprintf(w, "Revision: `%s`%s\n", rev, tree)
	}
	section := ""
	for _, f := range figs {
		if f.Section != section {
			section = f.Section
			fmt.Fprintf(w, "\n**%s**\n\n", section)
			if before != nil {
				fmt.Fprintln(w, "| figure | before | now | target | met | key |")
				fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
			} else {
				fmt.Fprintln(w, "| figure | value | target | met | key |")
				fmt.Fprintln(w, "| --- | --- | --- | --- | --- |")
			}
		}
		val := num(f.Value) + " " + f.Unit
		key := "`" + f.Key + "`"
		if f.Note != "" {
			key += " — " + strings.ReplaceAll(f.Note, "|", "/")
		}
		if before != nil {
			b := "—"
			if v, ok := before[f.Key].(float64); ok {
				b = num(v) + " " + f.Unit
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", f.Label, b, val, f.Target, f.Met, key)
		} else {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", f.Label, val, f.Target, f.Met, key)
		}
	}
	for _, n := range notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
}
