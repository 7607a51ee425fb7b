package api

// CanonicalPath is canonicalPath, for the fuzz targets of package api_test, which must tell a
// path refused before routing from one a handler judged.
var CanonicalPath = canonicalPath
