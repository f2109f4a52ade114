package acp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/jsonrpc"
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

// TestArraysAreCountedBeforeTheyAreBuilt: an array of more items than a
// command can take, or params of more members than any request has, are
// refused before anything is built from them; what an array builds is
// charged to its request's budget first, and given back with its answer.
func TestArraysAreCountedBeforeTheyAreBuilt(t *testing.T) {
	array := func(n int) string { return "[" + strings.Repeat(`"",`, n-1) + `""]` }
	for _, tc := range []struct {
		name, params, want string
	}{
		{"args", `{"args":` + array(maxItems+1) + `}`, fmt.Sprintf("args: more than %d items", maxItems)},
		{"members", `{` + strings.Repeat(`"a":1,`, maxMembers) + `"b":2}`, fmt.Sprintf("params: more than %d members", maxMembers)},
	} {
		f, err := decodeFields(json.RawMessage(tc.params), "")
		if err == nil {
			_, err = items[string](f, "args", nil)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	var dirs []string
	f, _ := decodeFields(json.RawMessage(`{"dirs":`+array(maxItems+1)+`}`), "")
	if err := get(f, "dirs", false, &dirs); err == nil || !strings.Contains(err.Error(), "dirs: more than") || dirs != nil {
		t.Errorf("get of a long array: %v, %d built; want it refused, none built", err, len(dirs))
	}

	l := newRequestLimiter()
	a := &account{l: l, method: MethodCreate}
	ctx := context.WithValue(context.Background(), accountKey{}, a)
	raw := `{"args":` + array(1000) + `,"env":[{"name":"A","value":"b"},{"name":"C"},7]}`
	f, err := decodeParams(ctx, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	args, err := items[string](f, "args", nil)
	if err != nil || len(args) != 1000 {
		t.Fatalf("args: %d, %v", len(args), err)
	}
	if want := int64(1000*itemCost + len(array(1000))); l.bytes.Used() != want {
		t.Errorf("charged %d for the args, want %d", l.bytes.Used(), want)
	}
	a.close()
	if n := l.bytes.Used(); n != 0 {
		t.Errorf("%d bytes still charged after the answer", n)
	}
	// An array whose cost is over the connection's bound is refused
	// before it is built.
	l.bytes.Take(maxInFlightBytes - 1000)
	if _, err := items[string](f, "args", nil); err == nil || rpcError(ctx, err).Code != jsonrpc.RequestCancelled {
		t.Errorf("args past the connection's bound: %v, want -32800", err)
	}
}
