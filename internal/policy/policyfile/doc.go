// Package policyfile reads and writes sandbox policies in OpenShell's YAML
// policy format (OpenShell's docs/reference/policy-schema.mdx): the files
// users pass to 'openshell policy set --policy FILE' and 'openshell sandbox
// create --policy FILE', and the YAML 'openshell policy get --full' prints.
//
// The format differs from the protobuf SandboxPolicy in a few places, which
// Parse and Marshal translate as OpenShell does:
//
//   - filesystem_policy is the proto's filesystem;
//   - an endpoint's port and ports are one list in the proto (ports, with
//     port its first entry); a file with one port is written back as port;
//   - json_rpc.max_body_bytes and mcp.max_body_bytes are the proto's
//     json_rpc_max_body_bytes (the mcp stanza wins when both are given), and
//     mcp's other options are the proto's mcp;
//   - query matchers are a glob string or {any: [...]}; MCP params may be
//     nested maps (flattened to dotted keys) and an MCP rule's tool is
//     params.name;
//   - a network policy's or middleware's name defaults to its map key;
//   - advisor_proposed and provider_credentialed are set by the gateway and
//     cannot be written in a file; a binary's deprecated harness is
//     accepted and ignored.
//
// Parsing is strict: an unknown field, a value of the wrong type, a
// duplicate key or a missing version is an error naming the line and the
// field. Parse checks the shape of the file only; the gateway validates
// the policy's content (paths, hosts, rules) when it is stored.
package policyfile
