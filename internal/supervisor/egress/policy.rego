# The connection decision of the sandbox egress proxy (package egress).
#
# Evaluated once per connection (and per holder of the client socket) with
#   input: {"host": string, "port": number, "exe": string, "ancestors": [string],
#           "tails": [string]}
#     host as the client named it, exe the kernel-resolved executable of the
#     process holding the client socket ("" when unidentified), ancestors its
#     parents' executables, nearest first. argv is never part of the input.
#     tails is a lookup aid built by Go from host: "" and the host's ends
#     from each of its dots, ".b.c" and ".c" for "a.b.c" (lower-cased, one
#     trailing dot removed, as host below): the keys under which the host
#     patterns that may match it are filed. Which of them match is decided
#     here; a missing tail would leave patterns untried (deny), never allow.
#   data.egress: the policy generation's network_policies in lookup form,
#     built by Go once per generation (engine.go):
#     "rules": one per rule, sorted by name:
#       [{"name": string, "exact_binaries": {path}, "glob_binaries": [pattern]}]
#     "ports": the endpoints by port (decimal string), as [rule index,
#       endpoint index] pairs:
#       {port: {"exact_hosts": {host: [[i, j]]},
#               "glob_hosts": {tail: {pattern: [[i, j]]}},
#               "any_host": [[i, j]]}}   host "*" or "**", or hostless
#     Hosts are lower-cased. A host or binary entry containing "*" is a
#     pattern; in it every glob meta character of glob.match but "*" is
#     escaped, so "*" and "**" are the only wildcards. A host pattern is
#     filed under its tail: its end from the dot after its last label
#     containing "*" (".example.com" for "*.example.com" and
#     "*.s3.*.example.com"), "" when that label is the last ("api.*"); a host
#     it matches ends with the tail. A hostless endpoint (allowed_ips, no
#     host) is listed under any_host, as it allows any host on its port; one
#     without allowed_ips is not listed.
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

# "*" or "**" alone, or no host (allowed_ips): every host.
hits contains m if {
	some m in on_port.any_host
}

# Wildcard host with "." as separator: "*" matches within one DNS label
# ("*.example.com", "*-aiplatform.googleapis.com", "*.s3.*.amazonaws.com"),
# "**" across labels ("**.example.com"). Only the patterns filed under one
# of the host's tails are tried.
hits contains m if {
	some tail in input.tails
	some pattern, ms in on_port.glob_hosts[tail]
	glob.match(pattern, ["."], host)
	some m in ms
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

# (A partial set referenced whole is evaluated once per query; iterating it
# by reference would evaluate it again each time.)
all_hits := hits

# The endpoints matching host and port in every rule allowing the caller
# (an endpoint and a binary of the rule match).
matches := {m | some m in all_hits; binary_allowed(m[0])}

# The allowing rule is the smallest index among the matches ([i, j] pairs
# order by i first).
decision := {"allow": true, "rule": min(matches)[0], "matches": matches} if {
	count(matches) > 0
} else := {"allow": false, "reason": deny_reason}

# --- Deny reasons ---

deny_reason := "network connections not allowed by policy" if {
	count(rules) == 0
} else := sprintf("binary '%s' not allowed in policy '%s'", [input.exe, rules[min(all_hits)[0]].name]) if {
	count(all_hits) > 0
} else := sprintf("endpoint %s:%d is not allowed by any policy", [input.host, input.port])
