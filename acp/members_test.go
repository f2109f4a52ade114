package acp

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzMemberScan: on any input the scan does not fail, and on a valid
// JSON object it finds what encoding/json does: the object's own "id"
// (the last of a repeat, when short enough to keep), "method", "result"
// and "error".
func FuzzMemberScan(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"x","params":{"id":2}}`,
		`{"result":{"a":[1,{"b":"}"}]},"id":"q\"x"}`,
		`{"\u0069d":[1,2],"error":null}`,
		` { "id" : 1 , "id" : {"z":1} } `,
		`{"id":1`,
		`[1,2]`,
		`"x"`,
	} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		cut = max(cut%64, 1)
		m := &memberScan{}
		for rest := b; len(rest) > 0; {
			n := min(cut, len(rest))
			m.Write(rest[:n])
			rest = rest[n:]
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(b, &obj) != nil {
			return
		}
		_, method := obj["method"]
		_, result := obj["result"]
		_, rerr := obj["error"]
		if m.request != method || m.response != (result || rerr) {
			t.Errorf("%q: request %v response %v, want %v %v", b, m.request, m.response, method, result || rerr)
		}
		want, ok := obj["id"]
		if ok && len(want) <= maxScannedID && !bytes.Equal(m.id, want) {
			t.Errorf("%q: id %s, want %s", b, m.id, want)
		}
		if !ok && m.id != nil {
			t.Errorf("%q: id %s, want none", b, m.id)
		}
	})
}
