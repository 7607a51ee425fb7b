// Package migrations holds the numbered SQL migrations, embedded so that the binary carries its
// own schema. Each file is NNNN_name.up.sql (applied in order, once) with a matching
// NNNN_name.down.sql for operators who must step back by hand.
package migrations

import "embed"

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS
