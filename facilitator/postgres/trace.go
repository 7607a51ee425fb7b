package postgres

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Option configures Open.
type Option func(*pgxpool.Config)

// WithTracer has every statement of the store's pool reported to t (a StatementCounter, say). A
// t that also implements pgx.BatchTracer hears each statement of a pipelined batch.
func WithTracer(t pgx.QueryTracer) Option {
	return func(c *pgxpool.Config) { c.ConnConfig.Tracer = t }
}

// StatementCounter is a pgx tracer that counts the statements a store sends, by name, with the
// rows each answered, and the round trips they took: a query is one, a pipelined batch is one
// for all its statements. It is how the cost of a settlement in statements is measured (tests,
// profiles); it keeps no SQL arguments, so it holds nothing secret.
type StatementCounter struct {
	mu         sync.Mutex
	stats      map[string]*StatementStat
	roundTrips int64
}

// StatementStat is one statement's count.
type StatementStat struct {
	Name  string
	Calls int64 // times sent
	Rows  int64 // rows answered or affected, summed
}

// StatementCounts is a snapshot of a StatementCounter.
type StatementCounts struct {
	Statements []StatementStat // by name
	RoundTrips int64
}

// Total is the number of statements sent.
func (c StatementCounts) Total() int64 {
	var n int64
	for _, s := range c.Statements {
		n += s.Calls
	}
	return n
}

// Calls is how often the statement named name was sent.
func (c StatementCounts) Calls(name string) int64 {
	for _, s := range c.Statements {
		if s.Name == name {
			return s.Calls
		}
	}
	return 0
}

// Rows is how many rows the statement named name answered or affected, summed over its calls.
func (c StatementCounts) Rows(name string) int64 {
	for _, s := range c.Statements {
		if s.Name == name {
			return s.Rows
		}
	}
	return 0
}

// Counts returns what was counted so far.
func (sc *StatementCounter) Counts() StatementCounts {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := StatementCounts{RoundTrips: sc.roundTrips}
	for _, s := range sc.stats {
		out.Statements = append(out.Statements, *s)
	}
	sort.Slice(out.Statements, func(i, j int) bool { return out.Statements[i].Name < out.Statements[j].Name })
	return out
}

// Reset starts the counts again from zero.
func (sc *StatementCounter) Reset() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.stats, sc.roundTrips = nil, 0
}

func (sc *StatementCounter) add(sql string, rows int64, roundTrip bool) {
	name := StatementName(sql)
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.stats == nil {
		sc.stats = map[string]*StatementStat{}
	}
	s := sc.stats[name]
	if s == nil {
		s = &StatementStat{Name: name}
		sc.stats[name] = s
	}
	s.Calls++
	s.Rows += rows
	if roundTrip {
		sc.roundTrips++
	}
}

// StatementName is a statement's short name: the text of a leading "-- name" comment line when it
// has one (the store's hot statements do), else its first 60 characters with whitespace folded.
func StatementName(sql string) string {
	sql = strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(sql, "--"); ok {
		line, _, _ := strings.Cut(rest, "\n")
		return strings.TrimSpace(line)
	}
	folded := strings.Join(strings.Fields(sql), " ")
	if len(folded) > 60 {
		folded = folded[:60]
	}
	return folded
}

type traceSQL struct{}

// TraceQueryStart implements pgx.QueryTracer.
func (sc *StatementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceSQL{}, d.SQL)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (sc *StatementCounter) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(traceSQL{}).(string)
	sc.add(sql, d.CommandTag.RowsAffected(), true)
}

// TraceBatchStart implements pgx.BatchTracer: the batch is one round trip.
func (sc *StatementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	sc.mu.Lock()
	sc.roundTrips++
	sc.mu.Unlock()
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (sc *StatementCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	sc.add(d.SQL, d.CommandTag.RowsAffected(), false)
}

// TraceBatchEnd implements pgx.BatchTracer.
func (sc *StatementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
