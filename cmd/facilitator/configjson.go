package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// decodeNetworks reads the networks JSON; source names where it came from (the file, or the flag
// and variable) in its errors, with the line and column of what is wrong: an operator's file
// that fails should say where, not only that it did. Unknown keys are refused (a typo in a
// field's name must fail loudly), and so is anything after the one array.
func decodeNetworks(raw []byte, source string) ([]NetworkConfig, error) {
	var out []NetworkConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, jsonError(raw, source, errorOffset(raw, dec, err, reflect.TypeOf(out)), err)
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		next := end + int64(len(raw[end:])-len(bytes.TrimLeft(raw[end:], " \t\r\n")))
		return nil, jsonError(raw, source, next, errors.New("more after the networks array (one JSON array of entries is expected)"))
	}
	return out, nil
}

// errorOffset is where in raw a decoding error is: the byte a syntax error stopped at, the value
// a type error is about, the end of a truncated input, or the key an unknown field is (which
// encoding/json does not say: it is found again by walking raw against the target type).
func errorOffset(raw []byte, dec *json.Decoder, err error, target reflect.Type) int64 {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return syntax.Offset - 1 // the offending byte was the last one read
	case errors.As(err, &typ):
		return literalStart(raw, typ.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return int64(len(raw))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		if off, ok := unknownKey(json.NewDecoder(bytes.NewReader(raw)), raw, target); ok {
			return off
		}
	}
	return dec.InputOffset()
}

// literalStart is where the value ending at end starts: encoding/json places a type error after
// a string, number or boolean, and after the opening delimiter of an object or array.
func literalStart(raw []byte, end int64) int64 {
	i := min(max(end-1, 0), int64(len(raw)-1))
	if i < 0 {
		return 0
	}
	if raw[i] == '"' {
		for j := i - 1; j >= 0; j-- {
			if raw[j] == '"' && (j == 0 || raw[j-1] != '\\') {
				return j
			}
		}
		return i
	}
	for i > 0 && strings.IndexByte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-", raw[i-1]) >= 0 {
		i--
	}
	return i
}

// unknownKey walks the next value of dec as a value of type t and returns the offset of the
// first object key no field of its struct takes, as json's DisallowUnknownFields judges one
// (the tag's name, or the field's, matched exactly or else case-insensitively). A t of no
// struct below it (a map's values, an interface) takes any key.
func unknownKey(dec *json.Decoder, raw []byte, t reflect.Type) (int64, bool) {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	tok, err := dec.Token()
	if err != nil {
		return 0, false
	}
	switch tok {
	case json.Delim('['):
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for dec.More() {
			if off, ok := unknownKey(dec, raw, elem); ok {
				return off, true
			}
		}
	case json.Delim('{'):
		for dec.More() {
			before := dec.InputOffset()
			k, err := dec.Token()
			if err != nil {
				return 0, false
			}
			var field reflect.Type
			switch {
			case t != nil && t.Kind() == reflect.Struct:
				f, ok := jsonField(t, k.(string))
				if !ok {
					// The key starts at its quote, past the comma and space before it.
					return before + int64(bytes.IndexByte(raw[before:], '"')), true
				}
				field = f
			case t != nil && t.Kind() == reflect.Map:
				field = t.Elem()
			}
			if off, ok := unknownKey(dec, raw, field); ok {
				return off, true
			}
		}
	default:
		return 0, false // a scalar
	}
	_, _ = dec.Token() // the closing delimiter
	return 0, false
}

// jsonField is the type of the struct field key names, by encoding/json's rule.
func jsonField(t reflect.Type, key string) (reflect.Type, bool) {
	var folded reflect.Type
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f.Type, true
		}
		if folded == nil && strings.EqualFold(name, key) {
			folded = f.Type
		}
	}
	return folded, folded != nil
}

// jsonError names the source and the line and column (1-based, in bytes) of offset in raw.
func jsonError(raw []byte, source string, offset int64, err error) error {
	offset = max(0, min(offset, int64(len(raw))))
	before := raw[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n')
	return fmt.Errorf("%s:%d:%d: %s", source, line, col, strings.TrimPrefix(err.Error(), "json: "))
}
