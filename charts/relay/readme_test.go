package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/yaml"
)

// The chart's README lists every value: each key of values.yaml, down to the keys the schema
// closes (a free-form object such as resources is one value), with its default and meaning.

var readmeRow = regexp.MustCompile("^\\| `([A-Za-z0-9_.]+)` \\| ([^|]*) \\| ([^|]*[^ |][^|]*) \\|$")

// schemaNode is the part of values.schema.json that says where values nest.
type schemaNode struct {
	Properties map[string]schemaNode `json:"properties"`
}

// valueLeaves walks values along the schema: a key whose schema has properties is a section and
// is walked into, every other key is one value. It also returns the keys the schema knows that
// values.yaml gives no default.
func valueLeaves(prefix string, values map[string]any, schema schemaNode) (leaves map[string]any, undefaulted []string) {
	leaves = map[string]any{}
	for k, v := range values {
		sub, inSchema := schema.Properties[k]
		m, isMap := v.(map[string]any)
		if inSchema && len(sub.Properties) > 0 && isMap {
			l, u := valueLeaves(prefix+k+".", m, sub)
			for lk, lv := range l {
				leaves[lk] = lv
			}
			undefaulted = append(undefaulted, u...)
			continue
		}
		leaves[prefix+k] = v
	}
	for k := range schema.Properties {
		if _, ok := values[k]; !ok && prefix+k != "global" {
			undefaulted = append(undefaulted, prefix+k)
		}
	}
	return leaves, undefaulted
}

// defaultCell is how the README writes a default it can be held to: a scalar or an empty object
// or list in backticks; "" for the empty string. A non-empty object or list is described in words.
func defaultCell(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		if v == "" {
			return "`\"\"`", true
		}
		return "`" + v + "`", true
	case bool:
		return "`" + strconv.FormatBool(v) + "`", true
	case float64:
		return "`" + strconv.FormatFloat(v, 'f', -1, 64) + "`", true
	case int64:
		return "`" + strconv.FormatInt(v, 10) + "`", true
	case map[string]any:
		return "`{}`", len(v) == 0
	case []any:
		return "`[]`", len(v) == 0
	case nil:
		return "`null`", true
	}
	return "", false
}

func readJSONOrYAML(t *testing.T, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096).Decode(into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// readmeProblems compares the README's value rows with values.yaml's leaves.
func readmeProblems(readme string, leaves map[string]any) []string {
	rows := map[string]string{}
	var problems []string
	for line := range strings.SplitSeq(readme, "\n") {
		m := readmeRow.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			problems = append(problems, "the README lists "+m[1]+" twice")
		}
		rows[m[1]] = strings.TrimSpace(m[2])
	}
	keys := make([]string, 0, len(leaves))
	for k := range leaves {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cell, ok := rows[k]
		if !ok {
			problems = append(problems, "values.yaml has "+k+", which the README's values table does not list")
			continue
		}
		if want, exact := defaultCell(leaves[k]); exact && !strings.HasPrefix(cell, want) {
			problems = append(problems, "the README gives "+k+" the default "+cell+"; values.yaml's is "+want)
		}
	}
	for k := range rows {
		if _, ok := leaves[k]; !ok {
			problems = append(problems, "the README lists "+k+", which values.yaml does not have")
		}
	}
	slices.Sort(problems)
	return problems
}

// TestReadmeListsEveryValue: every value of values.yaml is a row of README.md's values table
// with its default, and the table lists nothing values.yaml lacks; every key the schema takes has
// a default in values.yaml.
func TestReadmeListsEveryValue(t *testing.T) {
	var values map[string]any
	readJSONOrYAML(t, "values.yaml", &values)
	var schema schemaNode
	readJSONOrYAML(t, "values.schema.json", &schema)
	leaves, undefaulted := valueLeaves("", values, schema)
	if len(leaves) < 40 {
		t.Fatalf("read only %d values from values.yaml", len(leaves))
	}
	for _, k := range undefaulted {
		t.Errorf("values.schema.json takes %s, which values.yaml gives no default", k)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range readmeProblems(string(readme), leaves) {
		t.Error(p)
	}
}

// TestReadmeCheckFindsAMissingValue: a value added to values.yaml and not to the README, a stale
// row and a wrong default each fail the check.
func TestReadmeCheckFindsAMissingValue(t *testing.T) {
	readme := "| `a.b` | `1` | one |\n| `gone` | `x` | no longer a value |\n| `s` | `no` | a string |\n"
	got := readmeProblems(readme, map[string]any{"a.b": float64(1), "new": true, "s": "yes"})
	want := []string{
		"the README gives s the default `no`; values.yaml's is `yes`",
		"the README lists gone, which values.yaml does not have",
		"values.yaml has new, which the README's values table does not list",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(`{"x":{}}`), &v); err != nil {
		t.Fatal(err)
	}
	if cell, exact := defaultCell(v["x"]); cell != "`{}`" || !exact {
		t.Fatalf("an empty object's default is %q (exact %v)", cell, exact)
	}
}
