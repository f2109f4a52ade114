package acp

import (
	"encoding/json"
	"io"
	"log/slog"
	"reflect"
	"testing"
)

func TestRewriteInitialize(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantCaps string
		wantMeta bool
	}{
		{"no capabilities", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}`, `{"terminal":true}`, false},
		{"terminal false", `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"terminal":false,"fs":{"readTextFile":true}}}}`, `{"fs":{"readTextFile":true},"terminal":true}`, false},
		{"zed meta", `{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{"_meta":{"terminal_output":true,"x":[1]}},"_meta":{"k":"v"}}}`, `{"_meta":{"terminal_output":true,"x":[1]},"terminal":true}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Proxy{}
			out := p.rewriteInitialize([]byte(tc.in))
			var got, in map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(tc.in), &in)
			var caps any
			json.Unmarshal([]byte(tc.wantCaps), &caps)
			gp, ip := got["params"].(map[string]any), in["params"].(map[string]any)
			if !reflect.DeepEqual(gp["clientCapabilities"], caps) {
				t.Errorf("capabilities = %v, want %v", gp["clientCapabilities"], caps)
			}
			// Everything else is as the editor wrote it.
			delete(gp, "clientCapabilities")
			delete(ip, "clientCapabilities")
			delete(got, "params")
			delete(in, "params")
			if !reflect.DeepEqual(gp, ip) || !reflect.DeepEqual(got, in) {
				t.Errorf("other fields changed: %s", out)
			}
			if p.editorMeta != tc.wantMeta {
				t.Errorf("editorMeta = %v", p.editorMeta)
			}
		})
	}
}

func TestRewriteUpdateLeavesOtherUpdatesAlone(t *testing.T) {
	p := &Proxy{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, line := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"a terminal"}}}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","toolCallId":"c","content":[{"type":"content","content":{"type":"text","text":"terminal"}}]}}}`,
	} {
		var m message
		json.Unmarshal([]byte(line), &m)
		if got := p.rewriteUpdate([]byte(line), m.Params); string(got) != line {
			t.Errorf("rewrote %s\n into %s", line, got)
		}
	}
}
