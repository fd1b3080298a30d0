package api_test

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/wardenhq/warden/internal/api"
	"github.com/wardenhq/warden/internal/ops"
)

// TestOpenAPIMatchesRoutes: the embedded OpenAPI document lists exactly the
// routes the server serves, with the scope each needs, and the error codes
// the facade has.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	var doc struct {
		OpenAPI string                               `yaml:"openapi"`
		Servers []struct{ URL string }               `yaml:"servers"`
		Paths   map[string]map[string]map[string]any `yaml:"paths"`
		Comps   struct {
			Schemas map[string]any `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") || len(doc.Servers) != 1 || doc.Servers[0].URL != api.Prefix {
		t.Fatalf("openapi %q servers %v", doc.OpenAPI, doc.Servers)
	}
	documented := map[string]string{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			scope, _ := op["x-scope"].(string)
			documented[strings.ToUpper(method)+" "+api.Prefix+path] = scope
		}
	}
	served := map[string]string{}
	for _, r := range api.Routes() {
		served[r.Method+" "+r.Path] = string(r.Scope)
	}
	var missing, extra, scope []string
	for k, s := range served {
		d, ok := documented[k]
		switch {
		case !ok:
			missing = append(missing, k)
		case d != s:
			scope = append(scope, k+": documented "+d+", served "+s)
		}
	}
	for k := range documented {
		if _, ok := served[k]; !ok {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing)+len(extra)+len(scope) > 0 {
		t.Fatalf("OpenAPI document and routes differ:\nnot documented: %v\nnot served: %v\nscope: %v", missing, extra, scope)
	}

	// The error schema's code enum is ops.Codes.
	errSchema := doc.Comps.Schemas["Error"].(map[string]any)
	inner := errSchema["properties"].(map[string]any)["error"].(map[string]any)
	enum := inner["properties"].(map[string]any)["code"].(map[string]any)["enum"].([]any)
	var codes []string
	for _, c := range enum {
		codes = append(codes, c.(string))
	}
	var want []string
	for _, c := range ops.Codes {
		want = append(want, string(c))
	}
	slices.Sort(codes)
	slices.Sort(want)
	if !slices.Equal(codes, want) {
		t.Fatalf("error codes documented %v, facade has %v", codes, want)
	}
}
