package acp

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func TestSetMember(t *testing.T) {
	tests := []struct {
		name, obj, member, value string
		fold                     bool
		want                     string
	}{
		{"replaced in place", `{"b":1, "a" : 2 ,"c":3}`, "a", `true`, false, `{"b":1, "a" : true ,"c":3}`},
		{"added first", `{ "b":1 }`, "a", `{"x":1}`, false, `{"a":{"x":1}, "b":1 }`},
		{"added to an empty object", ` {} `, "a", `1`, false, ` {"a":1} `},
		{"every repeat", `{"a":1,"a":[2]}`, "a", `3`, false, `{"a":3,"a":3}`},
		{"any case with fold", `{"Terminal":false,"terminal":false}`, "terminal", `true`, true, `{"Terminal":true,"terminal":true}`},
		{"exact without fold", `{"Terminal":false}`, "terminal", `true`, false, `{"terminal":true,"Terminal":false}`},
		{"an escaped name", `{"\u0061":1}`, "a", `2`, false, `{"\u0061":2}`},
		{"nested members stay", `{"o":{"a":1},"a":"<&>"}`, "a", `0`, false, `{"o":{"a":1},"a":0}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := setMember([]byte(tc.obj), tc.member, []byte(tc.value), tc.fold)
			if err != nil || string(got) != tc.want {
				t.Errorf("setMember(%s, %q) = %s, %v; want %s", tc.obj, tc.member, got, err, tc.want)
			}
			if !json.Valid(got) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
	for _, bad := range []string{`[1]`, `{"a":}`, `{"a":1`, ``} {
		if got, err := setMember([]byte(bad), "a", []byte("1"), false); err == nil {
			t.Errorf("setMember(%q) = %s, want an error", bad, got)
		}
	}
}

func TestDeleteMember(t *testing.T) {
	tests := []struct {
		name, obj, member, want string
		fold                    bool
	}{
		{"first", `{"a":1, "b":2}`, "a", `{"b":2}`, false},
		{"middle", `{"b":1, "a":[1,2] , "c":3}`, "a", `{"b":1 , "c":3}`, false},
		{"last", `{"b":1,"a":2 }`, "a", `{"b":1 }`, false},
		{"only", `{ "a":2 }`, "a", `{  }`, false},
		{"repeats, side by side", `{"a":1,"a":2,"b":3,"a":4}`, "a", `{"b":3}`, false},
		{"absent", `{"b":1}`, "a", `{"b":1}`, false},
		{"exact without fold", `{"A":1,"a":2}`, "a", `{"A":1}`, false},
		{"any case with fold", `{"A":1,"b":2,"a":3}`, "a", `{"b":2}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := deleteMember([]byte(tc.obj), tc.member, tc.fold)
			if err != nil || string(got) != tc.want {
				t.Errorf("deleteMember(%s, %q) = %s, %v; want %s", tc.obj, tc.member, got, err, tc.want)
			}
			if !json.Valid(got) {
				t.Errorf("not JSON: %s", got)
			}
		})
	}
}

// FuzzObjectEdit: an edited object is JSON, holds what the edit says and
// every other member as it was.
func FuzzObjectEdit(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, ` { "b" : [1,{"a":2}] , "a":"x","a":null } `, `{"\u0061":true,"A":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, obj string) {
		var before map[string]json.RawMessage
		if json.Unmarshal([]byte(obj), &before) != nil || before == nil {
			return
		}
		check := func(what string, out []byte, err error, want func(map[string]json.RawMessage)) {
			var got map[string]json.RawMessage
			if err != nil || json.Unmarshal(out, &got) != nil {
				t.Fatalf("%s of %s = %s, %v", what, obj, out, err)
			}
			wantMap := map[string]json.RawMessage{}
			for k, v := range before {
				wantMap[k] = v
			}
			want(wantMap)
			if len(got) != len(wantMap) {
				t.Fatalf("%s of %s = %s: members %d, want %d", what, obj, out, len(got), len(wantMap))
			}
			for k, v := range wantMap {
				if g, ok := got[k]; !ok || !jsonEqual(t, g, v) {
					t.Fatalf("%s of %s = %s: member %q", what, obj, out, k)
				}
			}
		}
		out, err := setMember([]byte(obj), "a", []byte(`{"n":1}`), false)
		check("setMember", out, err, func(m map[string]json.RawMessage) { m["a"] = json.RawMessage(`{"n":1}`) })
		out, err = deleteMember([]byte(obj), "a", false)
		check("deleteMember", out, err, func(m map[string]json.RawMessage) { delete(m, "a") })
	})
}

func decodeAny(t *testing.T, b []byte) any {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	return reflect.DeepEqual(decodeAny(t, a), decodeAny(t, b))
}

// FuzzSplitJSON: on any input splitJSON does not panic; on a valid JSON
// object or array it finds what encoding/json does (memberMap the map it
// decodes, the items the array it decodes), and countJSON counts them.
func FuzzSplitJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, ` [ 1 , "a\"]" , {"b":[2]} , null ] `, `{"\u0061":1,"a":2,"é":"}"}`, `{"a":[{"b":"\\"}]}`, `"x"`, `[1,`, `{"a"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw := []byte(s)
		var items []string
		splitErr := splitJSON(raw, func(name, value []byte) error {
			items = append(items, string(name)+"="+string(value))
			return nil
		})
		if !json.Valid(raw) {
			return
		}
		n, err := countJSON(raw, 1<<20)
		if err != splitErr || err == nil && n != len(items) {
			t.Fatalf("countJSON(%s) = %d, %v; splitJSON found %d, %v", s, n, err, len(items), splitErr)
		}
		var arr []json.RawMessage
		if json.Unmarshal(raw, &arr) == nil && arr != nil {
			if splitErr != nil || len(arr) != len(items) {
				t.Fatalf("splitJSON(%s): %q, %v; want %d items", s, items, splitErr, len(arr))
			}
			for i, v := range arr {
				if "="+string(v) != items[i] {
					t.Fatalf("splitJSON(%s) item %d = %s, want %s", s, i, items[i], v)
				}
			}
			return
		}
		var want map[string]json.RawMessage
		if json.Unmarshal(raw, &want) != nil || want == nil {
			if !errors.Is(splitErr, errNotContainer) {
				t.Fatalf("splitJSON(%s) of no container: %v", s, splitErr)
			}
			return
		}
		got, err := memberMap(raw)
		if err != nil && !errors.Is(err, errTooMany) {
			t.Fatalf("memberMap(%s): %v", s, err)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("memberMap(%s) = %q, want %q", s, got, want)
		}
	})
}
