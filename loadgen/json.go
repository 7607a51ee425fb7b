package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
)

func decodeJSON(res *http.Response, out any) error {
	raw, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %.200s", res.StatusCode, raw)
	}
	return json.Unmarshal(raw, out)
}

func numCPU() int { return runtime.NumCPU() }
