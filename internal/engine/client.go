package engine

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/moby/moby/client"
	"github.com/moby/moby/client/pkg/versions"
)

// API is the part of the Docker Engine API that sandboxd uses. The client
// New returns implements it; a test may give another.
type API interface {
	// ClientVersion is the API version the client speaks, once negotiated.
	ClientVersion() string
	// DaemonHost is the address the client reaches the engine at.
	DaemonHost() string
	Close() error

	Ping(ctx context.Context, options PingOptions) (PingResult, error)
	Info(ctx context.Context, options InfoOptions) (SystemInfoResult, error)
	NetworkInspect(ctx context.Context, networkID string, options NetworkInspectOptions) (NetworkInspectResult, error)
	ImageInspect(ctx context.Context, imageID string, options ...ImageInspectOption) (ImageInspectResult, error)
	ImageLoad(ctx context.Context, input io.Reader, options ...ImageLoadOption) (ImageLoadResult, error)

	ContainerCreate(ctx context.Context, options ContainerCreateOptions) (ContainerCreateResult, error)
	ContainerStart(ctx context.Context, containerID string, options ContainerStartOptions) (ContainerStartResult, error)
	ContainerInspect(ctx context.Context, containerID string, options ContainerInspectOptions) (ContainerInspectResult, error)
	ContainerLogs(ctx context.Context, containerID string, options ContainerLogsOptions) (ContainerLogsResult, error)
	ContainerUpdate(ctx context.Context, containerID string, options ContainerUpdateOptions) (ContainerUpdateResult, error)
	ContainerKill(ctx context.Context, containerID string, options ContainerKillOptions) (ContainerKillResult, error)
	ContainerRemove(ctx context.Context, containerID string, options ContainerRemoveOptions) (ContainerRemoveResult, error)
	ContainerList(ctx context.Context, options ContainerListOptions) (ContainerListResult, error)

	ExecCreate(ctx context.Context, containerID string, options ExecCreateOptions) (ExecCreateResult, error)
	ExecAttach(ctx context.Context, execID string, options ExecAttachOptions) (ExecAttachResult, error)
	ExecInspect(ctx context.Context, execID string, options ExecInspectOptions) (ExecInspectResult, error)
	ExecResize(ctx context.Context, execID string, options ExecResizeOptions) (ExecResizeResult, error)
}

// The client's option and result types, under their own names.
type (
	PingOptions             = client.PingOptions
	PingResult              = client.PingResult
	InfoOptions             = client.InfoOptions
	SystemInfoResult        = client.SystemInfoResult
	NetworkInspectOptions   = client.NetworkInspectOptions
	NetworkInspectResult    = client.NetworkInspectResult
	ImageInspectOption      = client.ImageInspectOption
	ImageInspectResult      = client.ImageInspectResult
	ImageLoadOption         = client.ImageLoadOption
	ImageLoadResult         = client.ImageLoadResult
	ContainerCreateOptions  = client.ContainerCreateOptions
	ContainerCreateResult   = client.ContainerCreateResult
	ContainerStartOptions   = client.ContainerStartOptions
	ContainerStartResult    = client.ContainerStartResult
	ContainerInspectOptions = client.ContainerInspectOptions
	ContainerInspectResult  = client.ContainerInspectResult
	ContainerLogsOptions    = client.ContainerLogsOptions
	ContainerLogsResult     = client.ContainerLogsResult
	ContainerUpdateOptions  = client.ContainerUpdateOptions
	ContainerUpdateResult   = client.ContainerUpdateResult
	ContainerKillOptions    = client.ContainerKillOptions
	ContainerKillResult     = client.ContainerKillResult
	ContainerRemoveOptions  = client.ContainerRemoveOptions
	ContainerRemoveResult   = client.ContainerRemoveResult
	ContainerListOptions    = client.ContainerListOptions
	ContainerListResult     = client.ContainerListResult
	ExecCreateOptions       = client.ExecCreateOptions
	ExecCreateResult        = client.ExecCreateResult
	ExecAttachOptions       = client.ExecAttachOptions
	ExecAttachResult        = client.ExecAttachResult
	ExecInspectOptions      = client.ExecInspectOptions
	ExecInspectResult       = client.ExecInspectResult
	ExecResizeOptions       = client.ExecResizeOptions
	ExecResizeResult        = client.ExecResizeResult
	HijackedResponse        = client.HijackedResponse
	ConsoleSize             = client.ConsoleSize
	Filters                 = client.Filters
)

// ImageLoadQuiet makes ImageLoad report no progress.
func ImageLoadQuiet() ImageLoadOption { return client.ImageLoadWithQuiet(true) }

// New returns a client for the engine the environment names (DOCKER_HOST,
// DOCKER_API_VERSION, DOCKER_CERT_PATH, DOCKER_TLS_VERIFY), or the local
// socket. It negotiates the API version with the engine on first use.
func New() (API, error) {
	cli, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker client: %w", err)
	}
	return cli, nil
}

// Socket returns the path of the unix socket api reaches the engine
// through, or "" when it reaches it otherwise.
func Socket(api API) string {
	if h, ok := strings.CutPrefix(api.DaemonHost(), "unix://"); ok {
		return h
	}
	return ""
}

// VersionBelow reports whether the API version api speaks is older than v
// (such as "1.42").
func VersionBelow(api API, v string) bool {
	return versions.LessThan(api.ClientVersion(), v)
}
