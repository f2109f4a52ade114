package acp

import (
	"bytes"
	"encoding/json"
	"strings"
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

// TestMemberScan: what a line says of itself is found at the object's own
// level, wherever its members are and however the line is cut into
// pieces; a line cut off keeps what was whole.
func TestMemberScan(t *testing.T) {
	long := strings.Repeat("x", 2*maxScannedID)
	for _, tc := range []struct {
		line              string
		id                string
		request, response bool
	}{
		{`{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"aaa`, "7", true, false},
		{`{"jsonrpc":"2.0","method":"x","id":"s","params":[1,2`, `"s"`, true, false},
		{`{"id":3,"result":{"output":"aaaa`, "3", false, true},
		{`{"jsonrpc":"2.0","result":{"a":"b"},"id":4}`, "4", false, true},
		{`{"jsonrpc":"2.0","params":{"a":"aaaa`, "", false, false},
		{`not json`, "", false, false},
		{`[{"id":1,"method":"x"}]`, "", false, false},
		// The id after what is too long to keep.
		{`{"jsonrpc":"2.0","method":"x","params":{"env":["` + long + `"],"id":99},"id":12}` + "\n", "12", true, false},
		{` {"method" : "x" , "id" : "a,b}" }`, `"a,b}"`, true, false},
		{`{"\u0069d":5,"\"method":1}`, "5", false, false},
		{`{"id":{"a":[1,2]},"method":"x"}`, `{"a":[1,2]}`, true, false},
		{`{"id":1,"id":2,"error":{}}`, "2", false, true},
		{`{"id":"` + long + `","method":"x"}`, "", true, false},
		{`{"id":"a\"b","method":"x"}`, `"a\"b"`, true, false},
		{`{"id":5`, "", false, false},
	} {
		for _, cut := range []int{1, 3, 4096} {
			m := &memberScan{}
			for rest := []byte(tc.line); len(rest) > 0; {
				n := min(cut, len(rest))
				m.Write(rest[:n])
				rest = rest[n:]
			}
			if string(m.id) != tc.id || m.request != tc.request || m.response != tc.response {
				t.Errorf("%.60q in pieces of %d: %s %v %v, want %s %v %v", tc.line, cut, m.id, m.request, m.response, tc.id, tc.request, tc.response)
			}
		}
	}
}
