package client

// ExtensionVersion is the version of this implementation's SQLite replication (the Go
// API, the loadable extension and its bindings), as it names itself to servers.
const ExtensionVersion = "0.1.0"

// DefaultUserAgent is the User-Agent every request carries unless WithUserAgent says
// otherwise: the replication's name and version, so a gateway or proxy can attribute
// traffic and require a minimum version, whichever entry point (Go API, extension,
// binding) sent it.
const DefaultUserAgent = "sqlite-ursula-vfs/" + ExtensionVersion
