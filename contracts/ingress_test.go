package contracts

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

const offer32 = `{"interfacesVersion":"32.36.0","minimumPeerVersion":"32.0.0"}`

func TestClusterIngressEnvironmentNamesAreTheSeeds(t *testing.T) {
	want := ClusterIngressEnvironment{"SERVEZONE_CLUSTER_INGRESS_BEARER", "SERVEZONE_CLUSTER_RELAY_ORIGIN", "SERVEZONE_CLUSTER_NODE_ID"}
	if got := ClusterIngressEnvironmentNames(); got != want {
		t.Fatalf("names = %+v", got)
	}
	n := ClusterIngressEnvironmentNames()
	n.Bearer = "changed"
	if ClusterIngressEnvironmentNames().Bearer != want.Bearer {
		t.Fatal("the names are not frozen")
	}
}

func TestValidateClusterIngressRegistration(t *testing.T) {
	const secret = "bearer-TOPSECRET-value"
	cases := []struct {
		name, body string
		want       []string
	}{
		{"the seed's example", `{"bearer":"` + secret + `","version":"3.0.0","nodeId":"node-a","protocol":` + offer32 + `}`, nil},
		{"capabilities", `{"bearer":"b","version":"3.0.0","nodeId":"_node","capabilities":["h2","websocket"],"protocol":` + offer32 + `}`, nil},
		{"empty capabilities", `{"bearer":"b","version":"3.0.0","nodeId":"-n","capabilities":[],"protocol":` + offer32 + `}`, nil},
		{"not an object", `[]`, []string{"cluster ingress registration must use its exact schema"}},
		{"unknown key", `{"bearer":"b","version":"3.0.0","nodeId":"n","protocol":` + offer32 + `,"schemaVersion":1}`,
			[]string{"cluster ingress registration must use its exact schema"}},
		{"missing protocol", `{"bearer":"b","version":"3.0.0","nodeId":"n"}`, []string{"cluster ingress registration must use its exact schema"}},
		{"repeated key", `{"bearer":"b","bearer":"c","version":"3.0.0","nodeId":"n","protocol":` + offer32 + `}`,
			[]string{"cluster ingress registration must use its exact schema"}},
		{"one reason per violation", `{"bearer":1,"version":3,"nodeId":"node a","capabilities":["b",2],"protocol":{"interfacesVersion":"32.x","minimumPeerVersion":"32.0.0"}}`,
			[]string{
				"cluster ingress registration bearer must be a string",
				"cluster ingress registration version must be a string",
				"cluster ingress registration nodeId must be a cluster node id",
				"cluster ingress registration capabilities must be an array of strings",
				"cluster ingress registration protocol interfacesVersion must be a release version",
			}},
		// The seeds give bearer, version and capabilities no grammar: the relay forwards them and
		// acts on none, so it refuses none a Cloudly might accept.
		{"any version, any capabilities", `{"bearer":"","version":"v3.0.0-rc.1+build","nodeId":"n","capabilities":["b","a","a","H2",""],"protocol":` + offer32 + `}`, nil},
		{"capabilities not an array", `{"bearer":"b","version":"3.0.0","nodeId":"n","capabilities":"h2","protocol":` + offer32 + `}`,
			[]string{"cluster ingress registration capabilities must be an array of strings"}},
		{"node id too long", `{"bearer":"b","version":"3.0.0","nodeId":"` + strings.Repeat("n", 129) + `","protocol":` + offer32 + `}`,
			[]string{"cluster ingress registration nodeId must be a cluster node id"}},
		{"offer not plain data", `{"bearer":"` + secret + `","version":"3.0.0","nodeId":"n","protocol":"32.0.0"}`,
			[]string{"cluster ingress registration protocol must use its exact schema"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := ValidateClusterIngressRegistration([]byte(c.body), "")
			if !reflect.DeepEqual(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
				t.Fatalf("reasons = %q\nwant      %q", got, c.want)
			}
			for _, r := range got {
				if strings.Contains(r, secret) || strings.Contains(r, "TOPSECRET") {
					t.Fatalf("a reason quotes the bearer: %q", r)
				}
			}
		})
	}
	if got := ValidateClusterIngressRegistration([]byte(`1`), "ingress"); !reflect.DeepEqual(got, []string{"ingress must use its exact schema"}) {
		t.Fatalf("custom path: %q", got)
	}
}

func TestReadClusterIngressRegistration(t *testing.T) {
	body := []byte(`{"bearer":"s3cret","version":"3.0.0","nodeId":"-node","capabilities":["a"],"protocol":` + offer32 + `}`)
	r, err := ReadClusterIngressRegistration(body)
	if err != nil {
		t.Fatal(err)
	}
	if r.Bearer.Reveal() != "s3cret" || r.Version != "3.0.0" || r.NodeID != "-node" || !reflect.DeepEqual(r.Capabilities, []string{"a"}) || r.Protocol != RelayOffer {
		t.Fatalf("read %+v", r)
	}
	if s := fmt.Sprintf("%v %+v %#v", r, r, r); strings.Contains(s, "s3cret") {
		t.Fatalf("a printed registration reveals the bearer: %s", s)
	}
	if got := EncodeClusterIngressRegistration(r); string(got) != string(body) {
		t.Fatalf("encode = %s", got)
	}
	r.Capabilities = nil
	if got := string(EncodeClusterIngressRegistration(r)); strings.Contains(got, "capabilities") {
		t.Fatalf("absent capabilities encoded: %s", got)
	}
	// One pass: the offer is judged with the rest (the relay reads and negotiates it before, with
	// ReadProtocolOffer).
	_, err = ReadClusterIngressRegistration([]byte(`{"bearer":"s3cret","version":"3.0.0","nodeId":"n","protocol":{"interfacesVersion":1}}`))
	var inv *InvalidError
	if !errorsAs(err, &inv) || !reflect.DeepEqual(inv.Reasons, []string{"cluster ingress registration protocol must use its exact schema"}) {
		t.Fatalf("unreadable offer: %v", err)
	}
}

func errorsAs(err error, target **InvalidError) bool {
	e, ok := err.(*InvalidError)
	*target = e
	return ok
}

// TestValidateClusterIngressRegistrationRefusalSeedMessages pins the seed's exact messages.
func TestValidateClusterIngressRegistrationRefusalSeedMessages(t *testing.T) {
	cases := []struct {
		body string
		want []string
	}{
		{`{"code":"cluster-ingress-registration-refused","reason":"bearer-refused","retryAfterMs":1000}`, nil},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict","retryAfterMs":300000}`, nil},
		{`{"code":"cluster-ingress-registration-refused","reason":"not-ready","retryAfterMs":1e3}`, nil},
		{`null`, []string{"cluster ingress registration refusal must use its exact schema"}},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict"}`, []string{"cluster ingress registration refusal must use its exact schema"}},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict","retryAfterMs":1000,"bearer":"x"}`,
			[]string{"cluster ingress registration refusal must use its exact schema"}},
		{`{"code":"protocol-incompatible","reason":"major-mismatch","retryAfterMs":999}`, []string{
			"cluster ingress registration refusal code must be cluster-ingress-registration-refused",
			"cluster ingress registration refusal reason must be a cluster ingress registration refusal reason",
			"cluster ingress registration refusal retryAfterMs must be an integer from 1000 to 300000",
		}},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict","retryAfterMs":300001}`,
			[]string{"cluster ingress registration refusal retryAfterMs must be an integer from 1000 to 300000"}},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict","retryAfterMs":1000.5}`,
			[]string{"cluster ingress registration refusal retryAfterMs must be an integer from 1000 to 300000"}},
		{`{"code":"cluster-ingress-registration-refused","reason":"conflict","retryAfterMs":"1000"}`,
			[]string{"cluster ingress registration refusal retryAfterMs must be an integer from 1000 to 300000"}},
	}
	for _, c := range cases {
		got := ValidateClusterIngressRegistrationRefusal([]byte(c.body), "")
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %q\nwant %q", c.body, got, c.want)
		}
		_, ok := ReadClusterIngressRegistrationRefusal([]byte(c.body))
		if ok != (len(c.want) == 0) {
			t.Errorf("%s: read ok = %v", c.body, ok)
		}
	}
	for _, reason := range ClusterIngressRegistrationRefusalReasons() {
		r := ClusterIngressRegistrationRefusal{Code: ClusterIngressRegistrationRefusedCode, Reason: reason, RetryAfterMs: 5000}
		back, ok := ReadClusterIngressRegistrationRefusal(r.Data())
		if !ok || back != r {
			t.Errorf("%s does not round-trip: %s", reason, r.Data())
		}
		if r.Text() != "cluster-ingress-registration-refused: "+reason {
			t.Errorf("text %q", r.Text())
		}
		if ReadRefusalName(r.Text(), r.Data()) != ClusterIngressRegistrationRefusedCode {
			t.Errorf("name of %s not readable", reason)
		}
	}
	if got := ValidateClusterIngressRegistrationRefusal([]byte(`{}`), "errorData"); got[0] != "errorData must use its exact schema" {
		t.Errorf("custom path: %q", got)
	}
}

func TestValidateClusterIngressRouteTableChangeSeedMessages(t *testing.T) {
	cases := map[string][]string{
		`{"revision":0}`:                nil,
		`{"revision":9007199254740991}`: nil,
		`{"revision":9007199254740992}`: {"cluster ingress route table change revision must be a non-negative safe integer"},
		`{"revision":-1}`:               {"cluster ingress route table change revision must be a non-negative safe integer"},
		`{"revision":null}`:             {"cluster ingress route table change revision must be a non-negative safe integer"},
		`{"revision":1,"table":{}}`:     {"cluster ingress route table change must use its exact schema"},
		`{}`:                            {"cluster ingress route table change must use its exact schema"},
		`[1]`:                           {"cluster ingress route table change must use its exact schema"},
		`{"revision":1,"revision":2}`:   {"cluster ingress route table change must use its exact schema"},
		`{"revision":1.5}`:              {"cluster ingress route table change revision must be a non-negative safe integer"},
		`{"revision":"1"}`:              {"cluster ingress route table change revision must be a non-negative safe integer"},
		string(EncodeClusterIngressRouteTableChange(42)): nil,
	}
	for body, want := range cases {
		if got := ValidateClusterIngressRouteTableChange([]byte(body), ""); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %q want %q", body, got, want)
		}
	}
	if rev, ok := ReadClusterIngressRouteTableChange(EncodeClusterIngressRouteTableChange(42)); !ok || rev != 42 {
		t.Errorf("read %d %v", rev, ok)
	}
}

func TestRouteTableReaders(t *testing.T) {
	big := `{"revision":7,"routes":[{"id":12345678901234567890}],"key":"-----BEGIN PRIVATE KEY-----"}`
	tbl, err := ReadPushClusterRouteTableRequest([]byte(`{"table": ` + big + ` }`))
	if err != nil || tbl.Revision != 7 || string(tbl.Raw) != big {
		t.Fatalf("push: %+v %v", tbl, err)
	}
	if got := EncodeRouteTableAnswer(tbl); string(got) != `{"table":`+big+`}` {
		t.Fatalf("answer %s", got)
	}
	if got := EncodeAppliedRevision(tbl); string(got) != `{"appliedRevision":7}` {
		t.Fatalf("applied %s", got)
	}
	null, err := ReadGetClusterRouteTableResponse([]byte(`{"table":null}`))
	if err != nil || !null.IsNull() || string(EncodeRouteTableAnswer(null)) != `{"table":null}` || string(EncodeAppliedRevision(null)) != `{"appliedRevision":null}` {
		t.Fatalf("null: %+v %v", null, err)
	}
	bad := map[string]string{
		`{}`:                                    "cluster route table push must use its exact schema",
		`{"table":{"revision":1,"revision":2}}`: "cluster route table push table must not repeat its revision",
		`{"table":{"revision":1},"extra":1}`:    "cluster route table push must use its exact schema",
	}
	for body, want := range bad {
		_, err := ReadPushClusterRouteTableRequest([]byte(body))
		if inv, ok := err.(*InvalidError); !ok || inv.Reasons[0] != want {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
	for body, want := range map[string]int64{`{"knownRevision":null}`: -1, `{"knownRevision":12}`: 12} {
		if got, err := ReadGetClusterIngressRouteTableRequest([]byte(body)); err != nil || got != want {
			t.Errorf("%s: %d %v", body, got, err)
		}
		if got := string(EncodeGetClusterIngressRouteTableRequest(want)); got != body {
			t.Errorf("encode %d = %s", want, got)
		}
	}
	for _, body := range []string{`{}`, `{"knownRevision":-1}`, `{"knownRevision":"1"}`, `{"knownRevision":1,"x":1}`} {
		if _, err := ReadGetClusterIngressRouteTableRequest([]byte(body)); err == nil {
			t.Errorf("%s read", body)
		}
	}
	// Tolerance: a table that states no revision is still a table. Its revision is derived from
	// its bytes: the same bytes, the same revision; other bytes, another.
	t.Run("a table without a revision is served with one derived from its bytes", func(t *testing.T) {
		for _, table := range []string{`{}`, `{"routes":[],"revision":-3}`, `{"revision":"7"}`, `[]`, `"opaque"`} {
			tbl, err := ReadPushClusterRouteTableRequest([]byte(`{"table":` + table + `}`))
			if err != nil || !tbl.Derived || string(tbl.Raw) != table || tbl.Revision != DeriveRouteTableRevision([]byte(table)) {
				t.Errorf("%s: %+v %v", table, tbl, err)
			}
			if tbl.Revision < 0 || tbl.Revision > strictjson.MaxSafeInteger {
				t.Errorf("%s: derived revision %d is not a safe counter", table, tbl.Revision)
			}
		}
		a, _ := ReadGetClusterRouteTableResponse([]byte(`{"table":{"routes":[1]}}`))
		b, _ := ReadGetClusterRouteTableResponse([]byte(`{"table":{"routes":[2]}}`))
		again, _ := ReadPushClusterRouteTableRequest([]byte(`{"table": {"routes":[1]} }`))
		if a.Revision == b.Revision || a.Revision != again.Revision {
			t.Errorf("derived revisions %d %d %d: equal bytes must give equal revisions, others others", a.Revision, b.Revision, again.Revision)
		}
		stated, _ := ReadPushClusterRouteTableRequest([]byte(`{"table":{"revision":7,"unknown":{"a":1}}}`))
		if stated.Derived || stated.Revision != 7 {
			t.Errorf("a stated revision beside an unknown member: %+v", stated)
		}
	})
	if !ReadClusterIngressRegistrationAcceptance([]byte(`{"accepted":true,"revision":null,"protocol":`+offer32+`}`)) ||
		ReadClusterIngressRegistrationAcceptance([]byte(`{"accepted":"true"}`)) || ReadClusterIngressRegistrationAcceptance([]byte(`{}`)) {
		t.Error("acceptance reader")
	}
}

func TestTrafficStatisticsReaders(t *testing.T) {
	req, err := ReadGetClusterTrafficStatisticsRequest([]byte(`{"fromDayUtc":"2024-02-28","toDayUtc":"2024-03-01","cursor":"abc","limit":10}`))
	if err != nil || req != (TrafficStatisticsRequest{"2024-02-28", "2024-03-01", "abc", 10}) {
		t.Fatalf("%+v %v", req, err)
	}
	if got := string(req.Encode()); got != `{"fromDayUtc":"2024-02-28","toDayUtc":"2024-03-01","cursor":"abc","limit":10}` {
		t.Fatalf("encode %s", got)
	}
	want := []string{
		"cluster traffic statistics request fromDayUtc must be a UTC calendar day YYYY-MM-DD",
		"cluster traffic statistics request toDayUtc must be a UTC calendar day YYYY-MM-DD",
		"cluster traffic statistics request cursor must be 1 to 1048576 printable ASCII characters",
		"cluster traffic statistics request limit must be a positive integer",
	}
	if got := ValidateGetClusterTrafficStatisticsRequest([]byte(`{"fromDayUtc":"2023-02-29","toDayUtc":"2024-13-01","cursor":"a b","limit":0}`), ""); !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %q", got)
	}
	// The seeds bound neither limit nor the order of the days: a limit above 1 000 is served as
	// 1 000, and days in reverse name none.
	big, err := ReadGetClusterTrafficStatisticsRequest([]byte(`{"fromDayUtc":"2024-02-02","toDayUtc":"2024-02-01","limit":5000}`))
	if err != nil || big.Limit != MaxTrafficStatisticsLimit || !big.Empty() {
		t.Fatalf("limit 5000 over days in reverse: %+v %v", big, err)
	}
	if req.Empty() {
		t.Fatal("a request naming three days is empty")
	}
	day := func(d string) string {
		b, _ := json.Marshal(ClusterTrafficStatistics{DayUTC: d, NodeID: "n", Hostname: "a.example", Requests: 1})
		return string(b)
	}
	page, err := ReadGetClusterTrafficStatisticsResponse([]byte(`{"statistics":[`+day("2024-02-28")+`,`+day("2024-03-01")+`],"nextCursor":"p2"}`), req)
	if err != nil || len(page.Buckets) != 2 || page.Buckets[1].Day != "2024-03-01" || page.NextCursor != "p2" ||
		string(page.Buckets[0].Raw) != day("2024-02-28") || page.Buckets[0].NodeID != "n" || !page.Buckets[0].NodeStated {
		t.Fatalf("page %+v %v", page, err)
	}
	// Tolerance: a bucket's members are this project's guess; the page reader requires none of
	// them and reports what it found.
	t.Run("buckets are read tolerantly", func(t *testing.T) {
		body := `{"statistics":[{"hostname":"a.example","requests":1},{"dayUtc":"2024-02-28","nodeId":"n","extra":{"x":[1]}},` +
			`{"dayUtc":"28.02.2024","nodeId":7},` + day("2024-03-02") + `,1,{"dayUtc":"2024-02-28","dayUtc":"2024-02-29"}]}`
		req := req
		req.Limit = 6
		page, err := ReadGetClusterTrafficStatisticsResponse([]byte(body), req)
		if err != nil || len(page.Buckets) != 6 {
			t.Fatalf("%+v %v", page, err)
		}
		want := []TrafficBucket{
			{Object: true},
			{Object: true, Day: "2024-02-28", NodeStated: true, NodeID: "n"},
			{Object: true, NodeStated: true},
			{Object: true, Day: "2024-03-02", NodeStated: true, NodeID: "n"}, // outside the days: the caller judges
			{}, {},
		}
		for i, b := range page.Buckets {
			got := b
			got.Raw = nil
			if !reflect.DeepEqual(got, want[i]) {
				t.Errorf("bucket %d: %+v, want %+v", i, got, want[i])
			}
		}
	})
	for _, body := range []string{
		`{"statistics":{}}`, `{"statistics":[],"nextCursor":""}`, `{"statistics":[],"more":1}`, `{"statistics":[],"nextCursor":null}`,
	} {
		if _, err := ReadGetClusterTrafficStatisticsResponse([]byte(body), req); err == nil {
			t.Errorf("%s read", body)
		}
	}
	req.Limit = 1
	if _, err := ReadGetClusterTrafficStatisticsResponse([]byte(`{"statistics":[`+day("2024-02-28")+`,`+day("2024-02-28")+`]}`), req); err == nil {
		t.Error("a page above its limit was read")
	}
	for s, want := range map[string]bool{"2024-02-29": true, "2023-02-29": false, "2024-1-01": false, "20240101": false, "0001-01-01": true} {
		if IsUTCCalendarDay(s) != want {
			t.Errorf("IsUTCCalendarDay(%q) != %v", s, want)
		}
	}
}
