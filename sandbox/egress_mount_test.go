package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd"
)

func TestEgressAndAuditSettings(t *testing.T) {
	for _, tc := range []struct {
		text, want string // want: "" for none
	}{
		{"[egress]\nallow = [\"api.example.com\", \"*.example.org:8443\", \"[::1]:80\"]\n[audit]\nfile = \"/var/log/a.jsonl\"\n", ""},
		{"[egress]\nallow = [\"not a host\"]\n", "egress.allow"},
		{"[egress]\nallow = [\"*.com\"]\n", "wildcard"},
		{"[audit]\nfile = \"  \"\n", "audit.file"},
	} {
		p := filepath.Join(t.TempDir(), "sandbox.toml")
		if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(sandboxd.DefaultConfig, p, 2)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.text, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: %v, want an error saying %q", tc.text, err, tc.want)
		}
	}
}

func TestGatewayInTheContainer(t *testing.T) {
	var none *Gateway
	if none.mounts() != nil || none.env() != nil {
		t.Error("no gateway, yet mounts or environment")
	}
	g := &Gateway{Forwarder: "/c/fw", Socket: "/c/e.sock", Agent: "/c/a.sock"}
	for _, m := range g.mounts() {
		if !m.ReadOnly || !strings.HasPrefix(m.Target, GatewayDir+"/") {
			t.Errorf("mount %+v: want read-only, below %s", m, GatewayDir)
		}
	}
	env := g.env()
	for _, want := range []string{"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "ALL_PROXY=http://127.0.0.1:3128", "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"} {
		if !slices.Contains(env, want) {
			t.Errorf("environment %q lacks %q", env, want)
		}
	}
	if argv := agentArgv([]string{"agent", "--acp"}); argv[0] != gatewayForwarder || !slices.Equal(argv[len(argv)-3:], []string{"--", "agent", "--acp"}) {
		t.Errorf("agentArgv = %q", argv)
	}
}
