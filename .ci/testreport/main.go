// Command testreport reads `go test -json` on stdin and prints what `go
// test` prints without it (each package's result, the output of failing
// tests, build errors), then every test that was skipped, with its
// reason: CI must show that nothing it was to test was passed over.
//
//	GOFLAGS=-json go test ./... | go run ./.ci/testreport
//
// The exit code is go test's, which the caller takes from the pipe; this
// command fails only when it cannot read its input.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of test2json's output, and of the go command's own
// build events.
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

type testKey struct{ pkg, test string }

func main() {
	if err := report(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
}

func report(in io.Reader, out io.Writer) error {
	w := bufio.NewWriter(out)
	defer w.Flush()
	held := make(map[testKey][]string) // a running test's output
	var order []testKey                // held's keys, oldest first
	// flush prints what tests of pkg ("" for every package) still hold:
	// a test that never ended (a timeout's panic, os.Exit in a test)
	// gets no fail event, and its output is the reason its package
	// failed.
	flush := func(pkg string) {
		kept := order[:0]
		for _, k := range order {
			lines, ok := held[k]
			switch {
			case !ok:
			case pkg == "" || k.pkg == pkg:
				for _, line := range lines {
					fmt.Fprint(w, line)
				}
				delete(held, k)
			default:
				kept = append(kept, k)
			}
		}
		order = kept
	}
	var skipped []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			// Not an event (a line the go command wrote as it is).
			fmt.Fprintln(w, sc.Text())
			continue
		}
		k := testKey{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Test == "" && e.Action == "output":
			if strings.HasPrefix(e.Output, "FAIL") {
				flush(e.Package)
			}
			if e.Output != "PASS\n" {
				fmt.Fprint(w, e.Output)
			}
		case e.Action == "output":
			if _, ok := held[k]; !ok {
				order = append(order, k)
			}
			held[k] = append(held[k], e.Output)
		case e.Action == "fail" && e.Test != "":
			for _, line := range held[k] {
				fmt.Fprint(w, line)
			}
			delete(held, k)
		case e.Action == "skip" && e.Test != "":
			skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(held[k])))
			delete(held, k)
		case e.Action == "pass" && e.Test != "":
			delete(held, k)
		}
		w.Flush()
	}
	if err := sc.Err(); err != nil {
		return err
	}
	flush("")
	fmt.Fprintf(w, "\n%d tests skipped\n", len(skipped))
	for _, s := range skipped {
		fmt.Fprintln(w, "  "+s)
	}
	return nil
}

// reason is what a skipped test said last before its --- SKIP line.
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l != "" && !strings.HasPrefix(l, "--- SKIP") && !strings.HasPrefix(l, "=== ") {
			return l
		}
	}
	return "(no reason given)"
}
