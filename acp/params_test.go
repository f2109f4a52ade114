package acp

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParamsNameTheField(t *testing.T) {
	tests := []struct {
		params string
		want   string
	}{
		{`null`, "params"},
		{`[1]`, "params"},
		{`{"sessionId":1}`, "sessionId: must be a string"},
		{`{}`, "sessionId: required"},
		{`{"sessionId":"a\u0000b"}`, "sessionId: contains a NUL byte"},
		{`{"sessionId":"` + strings.Repeat("s", 4097) + `"}`, "sessionId: 4097 bytes is longer than the 4096"},
	}
	for _, tc := range tests {
		f, err := decodeFields(json.RawMessage(tc.params), "")
		if err == nil {
			var s string
			err = get(f, "sessionId", true, &s)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.params, err, tc.want)
		}
	}
}
