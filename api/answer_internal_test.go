package api

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/x402-facilitator/x402-facilitator/facilitator"
)

// TestValidAnswer: the hand-written answer is byte for byte what c.JSON's encoder writes, and
// every answer it does not cover is left to the encoder.
func TestValidAnswer(t *testing.T) {
	encode := func(res facilitator.VerifyResponse) []byte {
		var b bytes.Buffer
		if err := json.NewEncoder(&b).Encode(res); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	for _, payer := range []string{"0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "", "abcXYZ019"} {
		res := facilitator.VerifyResponse{IsValid: true, Payer: payer}
		got, ok := validAnswer(res)
		if want := encode(res); !ok || !bytes.Equal(got, want) {
			t.Fatalf("payer %q: %q %v, encoder %q", payer, got, ok, want)
		}
	}
	for _, res := range []facilitator.VerifyResponse{
		{IsValid: false, InvalidReason: "invalid_signature", Payer: "0x01"},
		{IsValid: true, Payer: "0x<script>"},
		{IsValid: true, Payer: `0x"`},
		{IsValid: true, Payer: "0xé"},
		{IsValid: true, Payer: "0x01", Extensions: map[string]any{"payment-identifier": map[string]any{}}},
		{IsValid: true, Payer: "0x01", Extra: map[string]any{}},
		{IsValid: true, InvalidMessage: "x"},
	} {
		if b, ok := validAnswer(res); ok {
			t.Fatalf("%+v answered by hand: %q", res, b)
		}
	}
}

// TestReadAll: readAll reads what io.ReadAll reads, whatever the size hint and however the
// reader splits its data, and passes a read error on.
func TestReadAll(t *testing.T) {
	body := strings.Repeat("0123456789abcdef", 200) // 3200 bytes
	for _, hint := range []int64{-1, 0, 1, 511, 512, 3199, 3200, 3201, 100000} {
		for _, r := range []func() io.Reader{
			func() io.Reader { return strings.NewReader(body) },
			func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) },
			func() io.Reader { return iotest.DataErrReader(strings.NewReader(body)) },
			func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) },
		} {
			got, err := readAll(r(), hint)
			if err != nil || string(got) != body {
				t.Fatalf("hint %d: %d bytes, %v", hint, len(got), err)
			}
		}
	}
	if _, err := readAll(iotest.TimeoutReader(strings.NewReader(body)), 10); err == nil {
		t.Fatal("a read error was dropped")
	}
}
