package sandbox

import (
	"strconv"
	"strings"

	"github.com/moby/moby/api/types/mount"
)

// EgressConfig is the [egress] section: where a contained agent may
// connect through the egress proxy.
type EgressConfig struct {
	// Allow lists the destinations, as HOST[:PORT] or *.SUFFIX[:PORT].
	Allow []string `toml:"allow"`
}

// AuditConfig is the [audit] section.
type AuditConfig struct {
	// File is the audit log appended to; empty for none.
	File string `toml:"file"`
}

// Gateway is the only way out of a contained agent's container, and the
// agent's way in: sandboxd's forwarder, a static program that runs as the
// container's main process and passes each connection to 127.0.0.1:ProxyPort
// on to the egress proxy's unix socket, and that starts the agent with
// another unix socket of sandboxd's as its stdin and stdout. All three are
// host files of sandboxd's, mounted read-only.
type Gateway struct {
	Forwarder string // the static forwarder program on the host
	Socket    string // the egress proxy's socket on the host
	Agent     string // the socket on the host the agent's stdio connects to
}

// Where the gateway is in the container, and the port of the forwarder on
// its loopback.
const (
	GatewayDir       = "/run/sandboxd"
	gatewayForwarder = GatewayDir + "/forward"
	gatewaySocket    = GatewayDir + "/egress.sock"
	gatewayAgent     = GatewayDir + "/agent.sock"
	ProxyPort        = 3128
)

// mounts are the gateway's files in the container; none without one.
func (g *Gateway) mounts() []mount.Mount {
	if g == nil {
		return nil
	}
	return []mount.Mount{
		bindMount(g.Forwarder, gatewayForwarder, "ro"),
		bindMount(g.Socket, gatewaySocket, "ro"),
		bindMount(g.Agent, gatewayAgent, "ro"),
	}
}

// entrypoint is the container's main process with a gateway: the
// forwarder, in place of `sleep infinity`. It runs as the container's own
// user, whom commands cannot signal; should it fail to listen, the
// container stops as it starts, and the session's start says why.
func (g *Gateway) entrypoint() []string {
	return []string{gatewayForwarder, "serve", strconv.Itoa(ProxyPort), gatewaySocket}
}

// agentArgv is what runs a contained agent, argv: the forwarder, which
// waits for itself to listen, connects to sandboxd's agent socket, and
// executes argv with that connection as its stdin and stdout.
func agentArgv(argv []string) []string {
	return append([]string{gatewayForwarder, "stdio", gatewayAgent, strconv.Itoa(ProxyPort), "--"}, argv...)
}

// env is the environment every process of the container gets: the
// forwarder as its HTTP, HTTPS and any other proxy, in both spellings
// programs read, and the container's own loopback left alone.
func (g *Gateway) env() []string {
	if g == nil {
		return nil
	}
	proxy := "http://127.0.0.1:" + strconv.Itoa(ProxyPort)
	var env []string
	for _, name := range []string{"HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"} {
		env = append(env, name+"="+proxy, strings.ToLower(name)+"="+proxy)
	}
	return append(env, "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1")
}
