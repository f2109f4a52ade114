package jsonrpc

// Error codes of JSON-RPC 2.0 itself.
const (
	// ParseError answers a message that is not valid JSON.
	ParseError = -32700
	// InvalidRequest answers JSON that is not a valid request.
	InvalidRequest = -32600
	// MethodNotFound answers a method the server does not have.
	MethodNotFound = -32601
	// InvalidParams answers params the method cannot take.
	InvalidParams = -32602
	// InternalError answers a failure of the server's own.
	InternalError = -32603
)

// Error codes of the Agent Client Protocol.
const (
	// ResourceNotFound answers a request that names an unknown session or
	// terminal.
	ResourceNotFound = -32002
	// RequestCancelled answers a request cancelled by $/cancel_request,
	// or aborted by shutdown or for resource constraints.
	RequestCancelled = -32800
)

// Error codes of the Agent Host Protocol.
const (
	// UnsupportedProtocolVersion answers an initialize that offers no
	// protocol version the server speaks.
	UnsupportedProtocolVersion = -32005
	// AuthRequired answers a client that presented no valid token.
	AuthRequired = -32007
	// NotFound answers a request that names an unknown channel or
	// terminal.
	NotFound = -32008
	// AlreadyExists answers a createTerminal for a channel that is taken.
	AlreadyExists = -32010
)
