package status

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The status page's counters, from one count source: read from the Prometheus registry /metrics
// serves — the relay's and every part's relay_* counters — never kept a second time beside it. Rates over the last minute come from samples of the same
// counters taken every rateStep.

const (
	rateWindow = time.Minute      // a rate is over the newest sample at least this old, or the oldest kept
	rateStep   = 10 * time.Second // how often the relay samples its counters
)

// CounterGroup is one counter family on the status page.
type CounterGroup struct {
	Name   string          `json:"name"`
	Help   string          `json:"help"`
	Series []CounterSeries `json:"series"`
	zero   bool            // every series is 0: the page folds the group away
}

// CounterSeries is one series: its labels ("direction=to-node,outcome=answered"), total, and
// increase per minute over the last minute (absent until two samples are a few seconds apart).
type CounterSeries struct {
	Labels    string   `json:"labels,omitempty"`
	Total     float64  `json:"total"`
	PerMinute *float64 `json:"perMinute,omitempty"`
}

// gatherCounters reads every relay_* counter from g, by series key (name{labels}).
func gatherCounters(g prometheus.Gatherer) ([]*dto.MetricFamily, map[string]float64) {
	families, _ := g.Gather() // a collector that fails leaves its families out; the rest stand
	families = slices.DeleteFunc(families, func(f *dto.MetricFamily) bool {
		return f.GetType() != dto.MetricType_COUNTER || !strings.HasPrefix(f.GetName(), "relay_")
	})
	values := make(map[string]float64)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			values[seriesKey(f.GetName(), labelsOf(m))] = m.GetCounter().GetValue()
		}
	}
	return families, values
}

func labelsOf(m *dto.Metric) string {
	var b strings.Builder
	for i, l := range m.GetLabel() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.GetName() + "=" + l.GetValue())
	}
	return b.String()
}

func seriesKey(name, labels string) string { return name + "{" + labels + "}" }

// counterGroups is the status page's counter section at now: every family, its series with their
// rates, the groups with a non-zero series first.
func (c *counterRates) counterGroups(now time.Time, families []*dto.MetricFamily) []CounterGroup {
	groups := make([]CounterGroup, 0, len(families))
	for _, f := range families {
		g := CounterGroup{Name: f.GetName(), Help: f.GetHelp(), zero: true}
		for _, m := range f.GetMetric() {
			s := CounterSeries{Labels: labelsOf(m), Total: m.GetCounter().GetValue()}
			if r, ok := c.perMinute(now, seriesKey(g.Name, s.Labels), s.Total); ok {
				s.PerMinute = &r
			}
			g.zero = g.zero && s.Total == 0
			g.Series = append(g.Series, s)
		}
		groups = append(groups, g)
	}
	slices.SortStableFunc(groups, func(a, b CounterGroup) int {
		return cmp.Or(cmp.Compare(boolInt(a.zero), boolInt(b.zero)), strings.Compare(a.Name, b.Name))
	})
	return groups
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// counterRates keeps samples of the counters for their rates. No clock and no I/O: every sample
// and question carries its time. Guarded by mu.
type counterRates struct {
	mu      sync.Mutex
	samples []counterSample // guarded by mu: oldest first, none older than needed
}

type counterSample struct {
	at     time.Time
	values map[string]float64
}

// add records the counters' values at now and forgets samples a rate no longer needs: all but
// the newest one at least rateWindow old.
func (c *counterRates) add(now time.Time, values map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, counterSample{at: now, values: values})
	for len(c.samples) > 1 && !c.samples[1].at.After(now.Add(-rateWindow)) {
		c.samples = c.samples[1:]
	}
}

// perMinute is how much the series key grew per minute from the oldest sample kept to value at
// now: over the last minute once the relay has sampled for one, over less before. A counter
// that went down was reset and counts from zero. False without a sample at least a second old.
func (c *counterRates) perMinute(now time.Time, key string, value float64) (float64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := 0
	for i+1 < len(c.samples) && !c.samples[i+1].at.After(now.Add(-rateWindow)) {
		i++
	}
	if len(c.samples) == 0 {
		return 0, false
	}
	s := c.samples[i]
	dt := now.Sub(s.at)
	if dt < time.Second {
		return 0, false
	}
	before := s.values[key]
	if value < before {
		before = 0
	}
	return (value - before) * float64(time.Minute) / float64(dt), true
}

// sampleCounters samples the registry's counters every rateStep until ctx ends.
func (s *Server) sampleCounters(ctx context.Context) {
	t := time.NewTicker(rateStep)
	defer t.Stop()
	for {
		_, values := gatherCounters(s.registry)
		s.rates.add(s.cfg.Now(), values)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
