package relaymodule_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestConformanceTableNamesEveryRefusal: docs/conformance.md traces every check the relay makes on
// a peer's bytes, so every refusal name the module defines — each RefusalName constant, and the
// codes of the two seed refusals that travel as error data (IProtocolRefusal,
// IClusterIngressRegistrationRefusal) — appears in a row of its tables. A name added to
// contracts/refusals.go (or anywhere) without a row fails here.
func TestConformanceTableNamesEveryRefusal(t *testing.T) {
	doc, err := os.ReadFile("docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	names := refusalNames(t)
	for _, want := range []string{"relay-session-foreign", "escrow-run-invalid", "restore-node-refused", "vpn-session-silent",
		"protocol-incompatible", "cluster-ingress-registration-refused", "registry-path-invalid"} {
		if !slices.Contains(names, want) {
			t.Fatalf("the refusal names read from the sources lack %s: %q", want, names)
		}
	}
	if missing := missingFromTable(string(doc), names); len(missing) > 0 {
		t.Fatalf("docs/conformance.md has no row naming %q: add the check site that refuses it", missing)
	}
	// The check can fail: a name no row names is reported.
	if missing := missingFromTable(string(doc), []string{"relay-never-named"}); !slices.Equal(missing, []string{"relay-never-named"}) {
		t.Fatalf("a name missing from the table went unreported: %q", missing)
	}
}

// refusalNames reads every refusal name the module's sources define: the value of each constant
// of type RefusalName (contracts' or a package's own), and each string constant named …Code in
// contracts (the seed refusal codes that travel as error data).
func refusalNames(t *testing.T) []string {
	t.Helper()
	var names []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		inContracts := filepath.Dir(path) == "contracts"
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				v := spec.(*ast.ValueSpec)
				refusal := isRefusalNameType(v.Type)
				for i, id := range v.Names {
					if i >= len(v.Values) || !(refusal || inContracts && strings.HasSuffix(id.Name, "Code")) {
						continue
					}
					lit, ok := v.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					if s, err := strconv.Unquote(lit.Value); err == nil {
						names = append(names, s)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func isRefusalNameType(e ast.Expr) bool {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name == "RefusalName"
	case *ast.SelectorExpr:
		return x.Sel.Name == "RefusalName"
	}
	return false
}

// missingFromTable returns the names no table row of doc (a line starting with "|") names in
// backticks.
func missingFromTable(doc string, names []string) []string {
	var rows strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "|") {
			rows.WriteString(line)
			rows.WriteByte('\n')
		}
	}
	var missing []string
	for _, n := range names {
		if !strings.Contains(rows.String(), "`"+n+"`") {
			missing = append(missing, n)
		}
	}
	return missing
}
