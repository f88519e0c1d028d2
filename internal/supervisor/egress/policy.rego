# The connection decision of the sandbox egress proxy (package egress).
#
# Evaluated once per connection (and per holder of the client socket) with
#   input: {"host": string, "port": number, "exe": string, "ancestors": [string]}
#     host as the client named it, exe the kernel-resolved executable of the
#     process holding the client socket ("" when unidentified), ancestors its
#     parents' executables, nearest first. argv is never part of the input.
#   data.egress: the policy generation's network_policies in lookup form,
#     built by Go once per generation (engine.go):
#     "rules": one per rule, sorted by name:
#       [{"name": string, "exact_binaries": {path}, "glob_binaries": [pattern]}]
#     "ports": the endpoints by port (decimal string), as [rule index,
#       endpoint index] pairs:
#       {port: {"exact_hosts": {host: [[i, j]]},
#               "glob_hosts": {tail: {pattern: [[i, j]]}},
#               "any_host": [[i, j]],   host "*" or "**"
#               "hostless": [[i, j]]}}
#     Hosts are lower-cased. A host or binary entry containing "*" is a
#     pattern; in it every glob meta character of glob.match but "*" is
#     escaped, so "*" and "**" are the only wildcards. A host pattern is
#     filed under its tail: the labels after its last label containing "*"
#     as written ("example.com" for "*.example.com" and "*.s3.*.example.com",
#     "" for "api.*"); a host it matches ends with "." and the tail. A
#     hostless endpoint is listed only when it has allowed_ips.
#
# The result is data.openshell.egress.decision:
#   {"allow": true, "rule": index of the first allowing rule,
#    "matches": {[rule index, endpoint index], ...} of every allowing rule}
#   {"allow": false, "reason": string}
# Go applies what needs the network after it: DNS resolution once, the SSRF
# guard on the resolved addresses (allowed_ips of the matched endpoints), the
# pinned dial, and the REST request rules of the matched endpoints.
package openshell.egress

rules := data.egress.rules

# The request host: case-insensitive, one trailing dot ignored.
host := trim_suffix(lower(input.host), ".")

# The endpoints listening on the requested port.
on_port := data.egress.ports[format_int(input.port, 10)]

# The caller's executable and its ancestors'; an unidentified one ("") is
# never matched.
caller_paths contains p if {
	some p in array.concat([input.exe], input.ancestors)
	p != ""
}

# --- Endpoint matching: port (on_port), then host ---

# hits are the [rule index, endpoint index] pairs matching host and port.

# Exact host.
hits contains m if {
	some m in on_port.exact_hosts[host]
}

# "*" or "**" alone: every host.
hits contains m if {
	some m in on_port.any_host
}

# Wildcard host with "." as separator: "*" matches within one DNS label
# ("*.example.com", "*-aiplatform.googleapis.com", "*.s3.*.amazonaws.com"),
# "**" across labels ("**.example.com"). Only the patterns filed under a
# tail the host ends with are tried: those under the host's part after
# each of its dots, and those under "" (whatever the host).
hits contains m if {
	some i in indexof_n(host, ".")
	some pattern, ms in on_port.glob_hosts[substring(host, i + 1, -1)]
	glob.match(pattern, ["."], host)
	some m in ms
}

hits contains m if {
	some pattern, ms in on_port.glob_hosts[""]
	glob.match(pattern, ["."], host)
	some m in ms
}

# Hostless endpoint (allowed_ips, no host): any host on the port; the
# resolved addresses must then lie inside allowed_ips (the SSRF guard in Go).
hits contains m if {
	some m in on_port.hostless
}

# --- Binary matching: the executable or any ancestor ---

# Exact path.
binary_allowed(i) if {
	count(rules[i].exact_binaries & caller_paths) > 0
}

# Glob with "/" as separator: "/usr/bin/*" one directory level, "/**" all.
binary_allowed(i) if {
	some b in rules[i].glob_binaries
	some p in caller_paths
	glob.match(b, ["/"], p)
}

# --- Decision ---

# The rules with an endpoint matching host and port (whatever the binary).
# (A partial set referenced whole is evaluated once per query; iterating it
# by reference would evaluate it again each time.)
endpoint_rules := {m[0] | some m in all_hits}

all_hits := hits

# The rules allowing the connection: an endpoint and a binary match.
allowing_rules := {i | some i in endpoint_rules; binary_allowed(i)}

# The endpoints matching host and port in every rule allowing the caller.
matches := {m | some m in all_hits; m[0] in allowing_rules}

decision := {"allow": true, "rule": min(allowing_rules), "matches": matches} if {
	count(allowing_rules) > 0
} else := {"allow": false, "reason": deny_reason}

# --- Deny reasons ---

deny_reason := "network connections not allowed by policy" if {
	count(rules) == 0
} else := sprintf("binary '%s' not allowed in policy '%s'", [input.exe, rules[min(endpoint_rules)].name]) if {
	count(endpoint_rules) > 0
} else := sprintf("endpoint %s:%d is not allowed by any policy", [input.host, input.port])
