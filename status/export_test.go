package status

// PublicLedger is publicLedger, for the table test.
var PublicLedger = publicLedger
