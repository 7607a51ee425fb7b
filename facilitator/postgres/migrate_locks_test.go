package postgres_test

import (
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/x402-facilitator/x402-facilitator/migrations"
)

// lockRulesFrom is the first migration held to the lock rules below: the ones from there on run
// against ledgers that are already big, while the previous release serves.
const lockRulesFrom = 15

// TestMigrationsTakeNoLongLocks: no migration from lockRulesFrom on holds a lock on a big table
// that stops reads or writes while it reads the table: an index is built CONCURRENTLY (in a file
// marked "-- migrate: no transaction"), a unique constraint is made from such an index (USING
// INDEX), a check or foreign key is added NOT VALID (and validated after, which blocks neither),
// and no column is added with a check, a reference or a default that must be computed per row,
// nor has its type changed. (A 1M-row ledger measured the difference: TestMigrationsKeepServing.)
func TestMigrationsTakeNoLongLocks(t *testing.T) {
	files, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	onBig := "(?:" + strings.Join(bigTables, "|") + ")"
	rules := []struct {
		bad *regexp.Regexp
		why string
	}{
		{regexp.MustCompile(`(?is)CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?\w+\s+ON\s+` + onBig + `\b`), "an index built without CONCURRENTLY holds off every write while it reads the table"},
		{regexp.MustCompile(`(?is)ADD\s+CONSTRAINT\s+\w+\s+(?:UNIQUE|PRIMARY\s+KEY)\s*\(`), "a unique constraint built in place holds every read and write off while its index builds: build the index CONCURRENTLY and add the constraint USING INDEX"},
		{regexp.MustCompile(`(?is)ADD\s+CONSTRAINT\s+\w+\s+(?:CHECK|FOREIGN\s+KEY)\b[^;]*;`), ""}, // checked below: NOT VALID
		{regexp.MustCompile(`(?is)ADD\s+COLUMN\b[^,;]*\b(?:CHECK|REFERENCES)\b`), "a column added with a check or a reference is validated over the whole table under an exclusive lock"},
		{regexp.MustCompile(`(?is)ADD\s+COLUMN\b[^,;]*\bDEFAULT\s+(?:now\(\)|random\(\)|gen_random_uuid\(\)|clock_timestamp\(\))`), "a volatile default rewrites the whole table under an exclusive lock"},
		{regexp.MustCompile(`(?is)ALTER\s+COLUMN\s+\w+\s+(?:SET\s+DATA\s+)?TYPE\b`), "a column's new type rewrites the whole table under an exclusive lock"},
	}
	checked := 0
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(f, "_", 2)[0])
		if err != nil || v < lockRulesFrom {
			continue
		}
		body, err := fs.ReadFile(migrations.FS, f)
		if err != nil {
			t.Fatal(err)
		}
		sql := stripComments(string(body))
		if strings.Contains(strings.ToUpper(sql), "CONCURRENTLY") && !strings.HasPrefix(string(body), "-- migrate: no transaction") {
			t.Errorf("%s: CONCURRENTLY cannot run in a transaction: mark the file \"-- migrate: no transaction\"", f)
		}
		for _, r := range rules {
			for _, m := range r.bad.FindAllString(sql, -1) {
				if r.why == "" {
					if !regexp.MustCompile(`(?i)NOT\s+VALID`).MatchString(m) {
						t.Errorf("%s: %q: a check or foreign key added without NOT VALID is validated under an exclusive lock; add it NOT VALID and VALIDATE it after", f, oneLine(m))
					}
					continue
				}
				t.Errorf("%s: %q: %s", f, oneLine(m), r.why)
			}
		}
		checked++
	}
	if checked == 0 {
		t.Fatalf("no migration from %d on was checked", lockRulesFrom)
	}
}

func stripComments(sql string) string {
	var out []string
	for _, line := range strings.Split(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
