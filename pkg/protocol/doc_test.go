package protocol_test

import (
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/wardenhq/warden/pkg/protocol"
)

// docs/protocol.md is the protocol for other-language implementers: every
// subject, stream, bucket, header and event kind the code defines must be
// named there. The names are read from this package's string constants, so
// a new one fails this test until the document mentions it.
func TestProtocolDocNamesEverySubjectHeaderAndBucket(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := protocolNames(t)
	if len(names) < 40 {
		t.Fatalf("found only %d protocol names in the package: the extraction is broken", len(names))
	}
	var missing []string
	for _, n := range names {
		if !strings.Contains(string(doc), n) {
			missing = append(missing, n)
		}
	}
	// Subjects and keys built by functions, with placeholders for their parts.
	for _, s := range []string{
		protocol.SubmitSubject("<job>"),
		protocol.ResultSubject("<pool>", "<agent>", "<job>", "<step>"),
		protocol.TaskSubject(0, "<pool>", "<agent>"),
		protocol.EventSubject("<kind>", "<id>"),
		protocol.DLQSubject("<pool>", "<agent>"),
		protocol.AgentControlSubject("<pool>", "<agent>"),
		protocol.JobKey("<job>"),
		protocol.StepKey("<job>", "<step>"),
		protocol.TaskMsgID("<job>", "<step>", 0),
		protocol.ResultMsgID("<job>", "<step>", 0, "<token>"),
	} {
		s = strings.ReplaceAll(s, "warden.task.0.", "warden.task.<shard>.")
		s = strings.ReplaceAll(s, ".0.", ".<epoch>.")
		s = strings.TrimSuffix(s, ".0")
		if strings.HasSuffix(s, "<step>") && strings.HasPrefix(s, "<job>") {
			s += ".<epoch>"
		}
		if !strings.Contains(string(doc), s) {
			missing = append(missing, s)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("docs/protocol.md does not mention %d protocol names the code uses:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}

// protocolNames returns the package's string constants that are protocol
// names: subjects (warden.…), streams (WARDEN_…), buckets (warden_…),
// headers (Warden-…, Nats-…) and event kinds.
func protocolNames(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	name := regexp.MustCompile(`^(warden\.[a-z.]+|WARDEN_[A-Z_]+|warden_[a-z_]+|Warden-[A-Za-z-]+|Nats-[A-Za-z-]+)$`)
	seen := map[string]bool{}
	{
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				vs, ok := n.(*ast.ValueSpec)
				if !ok {
					return true
				}
				eventKind := false
				if id, ok := vs.Type.(*ast.Ident); ok {
					// Typed values that appear in payloads and headers.
					switch id.Name {
					case "EventKind", "DLQReason", "RejectReason", "ReplyCode":
						eventKind = true
					}
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					s := constant.StringVal(constant.MakeFromLiteral(lit.Value, token.STRING, 0))
					if name.MatchString(s) || (eventKind && s != "") {
						seen[s] = true
					}
				}
				return true
			})
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}
