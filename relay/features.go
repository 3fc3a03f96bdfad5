package relay

import (
	"net/http"

	"code.foss.global/serve.zone/relay/feature"
)

// Features are the relay's optional parts. A part is any value implementing some of package
// feature's interfaces — serving methods, hearing events, running beside the relay, reporting to
// the status page — and the relay finds out which, one interface at a time, at New.
type Features struct {
	// Parts, in the order they hear each event; each is named for /readyz, errors and the status
	// page.
	Parts []Part
	// Registry serves /v2/ on the downstream listener (docs/protocol.md#registry-forwarding); it is run and reported like a
	// part when it implements feature.Component or feature.Reporter.
	Registry http.Handler
}

// Part is one optional part and its name.
type Part struct {
	Name string
	Impl any
}

// parts are the feature table: the enabled parts as the relay holds them — for each event, the
// parts that hear it; for each method, the handler that serves it (dispatch.go); the part that
// serves /v2/. Set at New (wireParts), only read after.
type parts struct {
	methods  dispatch     // which handler serves a method, per side
	registry http.Handler // serves /v2/ on the downstream listener; nil: registry forwarding is off

	attach     []feature.AttachWatcher
	detach     []feature.DetachWatcher
	custody    []feature.CustodyWatcher
	config     []feature.ConfigWatcher
	nodeBound  []feature.NodeWatcher
	peerGone   []feature.PeerWatcher
	lead       []feature.LeadWatcher
	rebinder   feature.Rebinder // the first part that keeps registrations for re-binding; nil: none
	components []named[feature.Component]
	reporters  []named[feature.Reporter]
}

// named is a part's interface with the part's name.
type named[T any] struct {
	name string
	v    T
}

// wireParts builds the feature table from feats: the dispatch tables (failing on a method served
// twice), then every part filed under each interface it implements, and handed the upstream and
// the tenure when it uses them. It runs once, at New, after the upstream is made.
func (r *Relay) wireParts(feats Features) (parts, error) {
	list := feats.withRegistry()
	d, err := r.newDispatch(list)
	if err != nil {
		return parts{}, err
	}
	ps := sortParts(list, r.up, r.tenure)
	ps.methods, ps.registry = d, feats.Registry
	return ps, nil
}

// sortParts files each part under every interface it implements, and hands the upstream and the
// tenure to the parts that use them.
func sortParts(list []Part, up feature.Upstream, tenure feature.Tenure) parts {
	var ps parts
	for _, pt := range list {
		v := pt.Impl
		if u, ok := v.(feature.UpstreamUser); ok {
			u.UseUpstream(up)
		}
		if u, ok := v.(feature.TenureUser); ok {
			u.UseTenure(tenure)
		}
		optIn(v, &ps.attach)
		optIn(v, &ps.detach)
		optIn(v, &ps.custody)
		optIn(v, &ps.config)
		optIn(v, &ps.nodeBound)
		optIn(v, &ps.peerGone)
		optIn(v, &ps.lead)
		if rb, ok := v.(feature.Rebinder); ok && ps.rebinder == nil {
			ps.rebinder = rb
		}
		if c, ok := v.(feature.Component); ok {
			ps.components = append(ps.components, named[feature.Component]{pt.Name, c})
		}
		if r, ok := v.(feature.Reporter); ok {
			ps.reporters = append(ps.reporters, named[feature.Reporter]{pt.Name, r})
		}
	}
	return ps
}

// withRegistry is list with the registry, when on, as its last part.
func (f Features) withRegistry() []Part {
	list := f.Parts
	if f.Registry != nil {
		list = append(list[:len(list):len(list)], Part{Name: "registry", Impl: f.Registry})
	}
	return list
}

// optIn adds v to a part list when it implements that list's interface.
func optIn[T any](v any, to *[]T) {
	if w, ok := v.(T); ok {
		*to = append(*to, w)
	}
}
