"""Gateway API v1 (standard channel, v1.2) type tables for fleet/api/k8s_schema.json.

The official `kubernetes` Python client has no Gateway API models, so
`gen_k8s_schema.py` cannot read these kinds' fields from it.  This module
holds them by hand, in exactly the format the generator emits for the
client's models (`{"fields": {json_name: {"type": expr, "description": str}},
"description": str}`; a type expression is a scalar name, `{"ref": T}`,
`{"list": expr}` or `{"map": expr}`), transcribed from
sigs.k8s.io/gateway-api `apis/v1/*_types.go` and the standard-channel CRDs.
Only standard-channel fields are listed: experimental ones (sessionPersistence,
retry, rule names, mirror percentages...) are pruned like any unknown field.

Type names carry a `GatewayV1` prefix so they never collide with the client's
`V1*` models; `V1Condition`, `V1ObjectMeta` and `V1LabelSelector` are the
client's own meta types, as in the upstream Go types.
"""

from __future__ import annotations

from typing import Any

P = "GatewayV1"


def ref(name: str) -> dict[str, str]:
    return {"ref": name if name.startswith(("V1", P)) else P + name}


def lst(expr: Any) -> dict[str, Any]:
    return {"list": expr}


def f(type_: Any, description: str) -> dict[str, Any]:
    return {"type": type_, "description": " ".join(description.split())}


def t(doc: str, /, **fields: dict[str, Any]) -> dict[str, Any]:
    return {"fields": fields, "description": " ".join(doc.split())}


_KIND = "Kind is a string value representing the REST resource this object represents."
_API_VERSION = "APIVersion defines the versioned schema of this representation of an object."
_META = "Standard object's metadata."


def _root(description: str, spec: str, status: str) -> dict[str, Any]:
    return t(description, apiVersion=f("string", _API_VERSION), kind=f("string", _KIND),
             metadata=f(ref("V1ObjectMeta"), _META),
             spec=f(ref(spec), "Spec defines the desired state of the resource."),
             status=f(ref(status), "Status defines the current state of the resource."))


_CONDITIONS = lst(ref("V1Condition"))

TYPES: dict[str, dict[str, Any]] = {
    # ---- GatewayClass -------------------------------------------------------------
    P + "GatewayClass": _root(
        "GatewayClass describes a class of Gateways available to the user for creating Gateway "
        "resources. It is recommended that this resource be used as a template for Gateways: a "
        "Gateway is based on the state of the GatewayClass at the time it was created. "
        "GatewayClass is a Cluster level resource.", P + "GatewayClassSpec", P + "GatewayClassStatus"),
    P + "GatewayClassSpec": t(
        "GatewayClassSpec reflects the configuration of a class of Gateways.",
        controllerName=f("string", """ControllerName is the name of the controller that is managing
            Gateways of this class. The value of this field MUST be a domain prefixed path, e.g.
            "example.net/gateway-controller". This field is not mutable and cannot be empty."""),
        parametersRef=f(ref("ParametersReference"), """ParametersRef is a reference to a resource
            that contains the configuration parameters corresponding to the GatewayClass. This is
            optional if the controller does not require any additional configuration."""),
        description=f("string", "Description helps describe a GatewayClass with more details."),
    ),
    P + "ParametersReference": t(
        "ParametersReference identifies an API object containing controller-specific configuration "
        "resource within the cluster.",
        group=f("string", "Group is the group of the referent."),
        kind=f("string", "Kind is kind of the referent."),
        name=f("string", "Name is the name of the referent."),
        namespace=f("string", """Namespace is the namespace of the referent. This field is required
            when referring to a Namespace-scoped resource and MUST be unset when referring to a
            Cluster-scoped resource."""),
    ),
    P + "GatewayClassStatus": t(
        "GatewayClassStatus is the current status for the GatewayClass.",
        conditions=f(_CONDITIONS, """Conditions is the current status from the controller for this
            GatewayClass. Controllers should prefer to publish conditions using values of
            GatewayClassConditionType for the type of each Condition."""),
    ),
    # ---- Gateway ------------------------------------------------------------------
    P + "Gateway": _root(
        "Gateway represents an instance of a service-traffic handling infrastructure by binding "
        "Listeners to a set of IP addresses.", P + "GatewaySpec", P + "GatewayStatus"),
    P + "GatewaySpec": t(
        "GatewaySpec defines the desired state of Gateway.",
        gatewayClassName=f("string", "GatewayClassName used for this Gateway. This is the name of a "
                                     "GatewayClass resource."),
        listeners=f(lst(ref("Listener")), """Listeners associated with this Gateway. Listeners define
            logical endpoints that are bound on this Gateway's addresses. At least one Listener MUST
            be specified. Each Listener in a set of Listeners (for example, in a single Gateway) MUST
            be distinct, in that a traffic flow MUST be able to be assigned to exactly one listener."""),
        addresses=f(lst(ref("GatewaySpecAddress")), """Addresses requested for this Gateway. This is
            optional and behavior can depend on the implementation."""),
        infrastructure=f(ref("GatewayInfrastructure"), """Infrastructure defines infrastructure level
            attributes about this Gateway instance."""),
    ),
    P + "Listener": t(
        "Listener embodies the concept of a logical endpoint where a Gateway accepts network "
        "connections.",
        name=f("string", "Name is the name of the Listener. This name MUST be unique within a Gateway."),
        hostname=f("string", """Hostname specifies the virtual hostname to match for protocol types
            that define this concept. When unspecified, all hostnames are matched. This field is
            ignored for protocols that don't require hostname based matching. A wildcard hostname
            ("*.example.com") matches one or more DNS labels."""),
        port=f("integer", "Port is the network port. Multiple listeners may use the same port, subject "
                          "to the Listener compatibility rules."),
        protocol=f("string", "Protocol specifies the network protocol this listener expects to receive."),
        tls=f(ref("GatewayTLSConfig"), """TLS is the TLS configuration for the Listener. This field is
            required if the Protocol field is "HTTPS" or "TLS". It is invalid to set this field if the
            Protocol field is "HTTP", "TCP", or "UDP"."""),
        allowedRoutes=f(ref("AllowedRoutes"), """AllowedRoutes defines the types of routes that MAY be
            attached to a Listener and the trusted namespaces where those Route resources MAY be
            present."""),
    ),
    P + "GatewayTLSConfig": t(
        "GatewayTLSConfig describes a TLS configuration.",
        mode=f("string", """Mode defines the TLS behavior for the TLS session initiated by the client.
            There are two possible modes: Terminate (the TLS session between the downstream client and
            the Gateway is terminated at the Gateway) and Passthrough (the TLS session is NOT
            terminated by the Gateway)."""),
        certificateRefs=f(lst(ref("SecretObjectReference")), """CertificateRefs contains a series of
            references to Kubernetes objects that contains TLS certificates and private keys. These
            certificates are used to establish a TLS handshake for requests that match the hostname
            of the associated listener."""),
        options=f({"map": "string"}, """Options are a list of key/value pairs to enable extended TLS
            configuration for each implementation."""),
    ),
    P + "SecretObjectReference": t(
        "SecretObjectReference identifies an API object including its namespace, defaulting to Secret.",
        group=f("string", 'Group is the group of the referent. For example, "gateway.networking.k8s.io". '
                          'When unspecified or empty string, core API group is inferred.'),
        kind=f("string", 'Kind is kind of the referent. For example "Secret".'),
        name=f("string", "Name is the name of the referent."),
        namespace=f("string", """Namespace is the namespace of the referenced object. When unspecified,
            the local namespace is inferred. Cross-namespace references need a ReferenceGrant."""),
    ),
    P + "AllowedRoutes": t(
        "AllowedRoutes defines which Routes may be attached to this Listener.",
        namespaces=f(ref("RouteNamespaces"), """Namespaces indicates namespaces from which Routes may be
            attached to this Listener. This is restricted to the namespace of this Gateway by
            default."""),
        kinds=f(lst(ref("RouteGroupKind")), """Kinds specifies the groups and kinds of Routes that are
            allowed to bind to this Gateway Listener. When unspecified or empty, the kinds of Routes
            selected are determined using the Listener protocol."""),
    ),
    P + "RouteNamespaces": t(
        "RouteNamespaces indicate which namespaces Routes should be selected from.",
        **{"from": f("string", """From indicates where Routes will be selected for this Gateway.
            Possible values are: All (Routes in all namespaces may be used by this Gateway), Selector
            (Routes in namespaces selected by the selector may be used by this Gateway) and Same (only
            Routes in the same namespace may be used by this Gateway).""")},
        selector=f(ref("V1LabelSelector"), """Selector must be specified when From is set to "Selector".
            In that case, only Routes in Namespaces matching this Selector will be selected by this
            Gateway. This field is ignored for other values of "From"."""),
    ),
    P + "RouteGroupKind": t(
        "RouteGroupKind indicates the group and kind of a Route resource.",
        group=f("string", "Group is the group of the Route."),
        kind=f("string", "Kind is the kind of the Route."),
    ),
    P + "GatewaySpecAddress": t(
        "GatewaySpecAddress describes an address that can be bound to a Gateway.",
        type=f("string", 'Type of the address: "IPAddress", "Hostname" or a domain-prefixed '
                         'implementation-specific value.'),
        value=f("string", "Value of the address. The validity of the values will depend on the type and "
                          "support by the controller."),
    ),
    P + "GatewayInfrastructure": t(
        "GatewayInfrastructure defines infrastructure level attributes about a Gateway instance.",
        labels=f({"map": "string"}, "Labels that SHOULD be applied to any resources created in response "
                                    "to this Gateway."),
        annotations=f({"map": "string"}, "Annotations that SHOULD be applied to any resources created in "
                                         "response to this Gateway."),
        parametersRef=f(ref("LocalParametersReference"), """ParametersRef is a reference to a resource
            that contains the configuration parameters corresponding to the Gateway."""),
    ),
    P + "LocalParametersReference": t(
        "LocalParametersReference identifies an API object containing controller-specific configuration "
        "resource within the namespace.",
        group=f("string", "Group is the group of the referent."),
        kind=f("string", "Kind is kind of the referent."),
        name=f("string", "Name is the name of the referent."),
    ),
    P + "GatewayStatus": t(
        "GatewayStatus defines the observed state of Gateway.",
        addresses=f(lst(ref("GatewayStatusAddress")), """Addresses lists the network addresses that have
            been bound to the Gateway."""),
        conditions=f(_CONDITIONS, """Conditions describe the current conditions of the Gateway. Known
            condition types are "Accepted" and "Programmed"."""),
        listeners=f(lst(ref("ListenerStatus")), "Listeners provide status for each unique listener port "
                                                "defined in the Spec."),
    ),
    P + "GatewayStatusAddress": t(
        "GatewayStatusAddress describes a network address that is bound to a Gateway.",
        type=f("string", "Type of the address."),
        value=f("string", "Value of the address. The validity of the values will depend on the type and "
                          "support by the controller."),
    ),
    P + "ListenerStatus": t(
        "ListenerStatus is the status associated with a Listener.",
        name=f("string", "Name is the name of the Listener that this status corresponds to."),
        supportedKinds=f(lst(ref("RouteGroupKind")), """SupportedKinds is the list indicating the Kinds
            supported by this listener."""),
        attachedRoutes=f("integer", """AttachedRoutes represents the total number of Routes that have
            been successfully attached to this Listener."""),
        conditions=f(_CONDITIONS, "Conditions describe the current condition of this listener."),
    ),
    # ---- HTTPRoute ----------------------------------------------------------------
    P + "HTTPRoute": _root(
        "HTTPRoute provides a way to route HTTP requests. This includes the capability to match "
        "requests by hostname, path, header, or query param. Filters can be used to specify additional "
        "processing steps. Backends specify where matching requests should be routed.",
        P + "HTTPRouteSpec", P + "HTTPRouteStatus"),
    P + "HTTPRouteSpec": t(
        "HTTPRouteSpec defines the desired state of HTTPRoute.",
        parentRefs=f(lst(ref("ParentReference")), """ParentRefs references the resources (usually
            Gateways) that a Route wants to be attached to."""),
        hostnames=f(lst("string"), """Hostnames defines a set of hostnames that should match against the
            HTTP Host header to select a HTTPRoute used to process the request. A hostname may be
            prefixed with a wildcard label (`*.`)."""),
        rules=f(lst(ref("HTTPRouteRule")), "Rules are a list of HTTP matchers, filters and actions."),
    ),
    P + "ParentReference": t(
        "ParentReference identifies an API object (usually a Gateway) that can be considered a parent "
        "of this resource (usually a route).",
        group=f("string", "Group is the group of the referent. When unspecified, "
                          '"gateway.networking.k8s.io" is inferred.'),
        kind=f("string", 'Kind is kind of the referent. Defaults to "Gateway".'),
        namespace=f("string", "Namespace is the namespace of the referent. When unspecified, this refers "
                              "to the local namespace of the Route."),
        name=f("string", "Name is the name of the referent."),
        sectionName=f("string", """SectionName is the name of a section within the target resource. For
            Gateways this is a Listener name."""),
        port=f("integer", "Port is the network port this Route targets."),
    ),
    P + "HTTPRouteRule": t(
        "HTTPRouteRule defines semantics for matching an HTTP request based on conditions (matches), "
        "processing it (filters), and forwarding the request to an API object (backendRefs).",
        matches=f(lst(ref("HTTPRouteMatch")), """Matches define conditions used for matching the rule
            against incoming HTTP requests. Each match is independent, i.e. this rule will be matched if
            **any** one of the matches is satisfied. If no matches are specified, the default is a
            prefix path match on "/", which has the effect of matching every HTTP request."""),
        filters=f(lst(ref("HTTPRouteFilter")), """Filters define the filters that are applied to requests
            that match this rule."""),
        backendRefs=f(lst(ref("HTTPBackendRef")), """BackendRefs defines the backend(s) where matching
            requests should be sent. If unspecified or invalid (refers to a non-existent resource or a
            Service with no endpoints), the rule performs no forwarding and a 500 status code is
            returned."""),
        timeouts=f(ref("HTTPRouteTimeouts"), "Timeouts defines the timeouts that can be configured for an "
                                             "HTTP request."),
    ),
    P + "HTTPRouteMatch": t(
        "HTTPRouteMatch defines the predicate used to match requests to a given action. Multiple match "
        "types are ANDed together, i.e. the match will evaluate to true only if all conditions are "
        "satisfied.",
        path=f(ref("HTTPPathMatch"), 'Path specifies a HTTP request path matcher. If this field is not '
                                     'specified, a default prefix match on the "/" path is provided.'),
        headers=f(lst(ref("HTTPHeaderMatch")), "Headers specifies HTTP request header matchers. Multiple "
                                               "match values are ANDed together."),
        queryParams=f(lst(ref("HTTPQueryParamMatch")), "QueryParams specifies HTTP query parameter "
                                                       "matchers. Multiple match values are ANDed together."),
        method=f("string", "Method specifies HTTP method matcher. When specified, this route will be "
                           "matched only if the request has the specified method."),
    ),
    P + "HTTPPathMatch": t(
        "HTTPPathMatch describes how to select a HTTP route by matching the HTTP request path.",
        type=f("string", "Type specifies how to match against the path Value: Exact, PathPrefix or "
                         "RegularExpression."),
        value=f("string", "Value of the HTTP path to match against."),
    ),
    P + "HTTPHeaderMatch": t(
        "HTTPHeaderMatch describes how to select a HTTP route by matching HTTP request headers.",
        type=f("string", "Type specifies how to match against the value of the header: Exact or "
                         "RegularExpression."),
        name=f("string", """Name is the name of the HTTP Header to be matched. Name matching MUST be case
            insensitive."""),
        value=f("string", "Value is the value of HTTP Header to be matched."),
    ),
    P + "HTTPQueryParamMatch": t(
        "HTTPQueryParamMatch describes how to select a HTTP route by matching HTTP query parameters.",
        type=f("string", "Type specifies how to match against the value of the query parameter: Exact or "
                         "RegularExpression."),
        name=f("string", "Name is the name of the HTTP query param to be matched. This must be an exact "
                         "string match."),
        value=f("string", "Value is the value of HTTP query param to be matched."),
    ),
    P + "HTTPRouteFilter": t(
        "HTTPRouteFilter defines processing steps that must be completed during the request or response "
        "lifecycle.",
        type=f("string", """Type identifies the type of filter to apply: RequestHeaderModifier,
            ResponseHeaderModifier, RequestMirror, RequestRedirect, URLRewrite or ExtensionRef."""),
        requestHeaderModifier=f(ref("HTTPHeaderFilter"), "RequestHeaderModifier defines a schema for a "
                                                         "filter that modifies request headers."),
        responseHeaderModifier=f(ref("HTTPHeaderFilter"), "ResponseHeaderModifier defines a schema for a "
                                                          "filter that modifies response headers."),
        requestMirror=f(ref("HTTPRequestMirrorFilter"), "RequestMirror defines a schema for a filter that "
                                                        "mirrors requests."),
        requestRedirect=f(ref("HTTPRequestRedirectFilter"), "RequestRedirect defines a schema for a filter "
                                                            "that responds to the request with an HTTP "
                                                            "redirection."),
        urlRewrite=f(ref("HTTPURLRewriteFilter"), "URLRewrite defines a schema for a filter that modifies "
                                                  "a request during forwarding."),
        extensionRef=f(ref("LocalObjectReference"), "ExtensionRef is an optional, implementation-specific "
                                                    "extension to the \"filter\" behavior."),
    ),
    P + "HTTPHeaderFilter": t(
        "HTTPHeaderFilter defines a filter that modifies the headers of an HTTP request or response.",
        set=f(lst(ref("HTTPHeader")), "Set overwrites the request with the given header (name, value) "
                                      "before the action."),
        add=f(lst(ref("HTTPHeader")), "Add adds the given header(s) (name, value) to the request before "
                                      "the action. It appends to any existing values associated with the "
                                      "header name."),
        remove=f(lst("string"), "Remove the given header(s) from the HTTP request before the action. The "
                                "value of Remove is a list of HTTP header names."),
    ),
    P + "HTTPHeader": t(
        "HTTPHeader represents an HTTP Header name and value as defined by RFC 7230.",
        name=f("string", "Name is the name of the HTTP Header to be matched. Name matching MUST be case "
                         "insensitive."),
        value=f("string", "Value is the value of HTTP Header to be matched."),
    ),
    P + "HTTPRequestRedirectFilter": t(
        "HTTPRequestRedirect defines a filter that redirects a request.",
        scheme=f("string", "Scheme is the scheme to be used in the value of the `Location` header in the "
                           "response. When empty, the scheme of the request is used."),
        hostname=f("string", "Hostname is the hostname to be used in the value of the `Location` header in "
                             "the response. When empty, the hostname in the `Host` header of the request "
                             "is used."),
        path=f(ref("HTTPPathModifier"), "Path defines parameters used to modify the path of the incoming "
                                        "request."),
        port=f("integer", "Port is the port to be used in the value of the `Location` header in the "
                          "response."),
        statusCode=f("integer", "StatusCode is the HTTP status code to be used in response (301 or 302)."),
    ),
    P + "HTTPURLRewriteFilter": t(
        "HTTPURLRewriteFilter defines a filter that modifies a request during forwarding.",
        hostname=f("string", "Hostname is the value to be used to replace the Host header value during "
                             "forwarding."),
        path=f(ref("HTTPPathModifier"), "Path defines a path rewrite."),
    ),
    P + "HTTPPathModifier": t(
        "HTTPPathModifier defines configuration for path modifiers.",
        type=f("string", "Type defines the type of path modifier: ReplaceFullPath or ReplacePrefixMatch."),
        replaceFullPath=f("string", "ReplaceFullPath specifies the value with which to replace the full "
                                    "path of a request during a rewrite or redirect."),
        replacePrefixMatch=f("string", """ReplacePrefixMatch specifies the value with which to replace the
            prefix match of a request during a rewrite or redirect. This is only compatible with a
            `PathPrefix` HTTPRouteMatch."""),
    ),
    P + "HTTPRequestMirrorFilter": t(
        "HTTPRequestMirrorFilter defines configuration for the RequestMirror filter.",
        backendRef=f(ref("BackendObjectReference"), "BackendRef references a resource where mirrored "
                                                    "requests are sent."),
    ),
    P + "LocalObjectReference": t(
        "LocalObjectReference identifies an API object within the namespace of the referrer.",
        group=f("string", "Group is the group of the referent."),
        kind=f("string", "Kind is kind of the referent."),
        name=f("string", "Name is the name of the referent."),
    ),
    P + "BackendObjectReference": t(
        "BackendObjectReference defines how an ObjectReference that is specific to BackendRef.",
        group=f("string", "Group is the group of the referent. When unspecified or empty string, core API "
                          "group is inferred."),
        kind=f("string", 'Kind is the Kubernetes resource kind of the referent. Defaults to "Service".'),
        name=f("string", "Name is the name of the referent."),
        namespace=f("string", "Namespace is the namespace of the backend. When unspecified, the local "
                              "namespace is inferred."),
        port=f("integer", "Port specifies the destination port number to use for this resource. Port is "
                          "required when the referent is a Kubernetes Service."),
    ),
    P + "HTTPBackendRef": t(
        "HTTPBackendRef defines how a HTTPRoute forwards a HTTP request.",
        group=f("string", "Group is the group of the referent. When unspecified or empty string, core API "
                          "group is inferred."),
        kind=f("string", 'Kind is the Kubernetes resource kind of the referent. Defaults to "Service".'),
        name=f("string", "Name is the name of the referent."),
        namespace=f("string", "Namespace is the namespace of the backend. When unspecified, the local "
                              "namespace is inferred."),
        port=f("integer", "Port specifies the destination port number to use for this resource."),
        weight=f("integer", """Weight specifies the proportion of requests forwarded to the referenced
            backend. This is computed as weight/(sum of all weights in this BackendRefs list). Weight is
            not a percentage and the sum of weights does not need to equal 100. If only one backend is
            specified and it has a weight greater than 0, 100% of the traffic is forwarded to that
            backend. If weight is set to 0, no traffic should be forwarded for this entry."""),
        filters=f(lst(ref("HTTPRouteFilter")), """Filters defined at this level should be executed if and
            only if the request is being forwarded to the backend defined here."""),
    ),
    P + "HTTPRouteTimeouts": t(
        "HTTPRouteTimeouts defines timeouts that can be configured for an HTTPRoute.",
        request=f("string", """Request specifies the maximum duration for a gateway to respond to an HTTP
            request (a Gateway API Duration such as "10s" or "1h30m"; "0s" disables it)."""),
        backendRequest=f("string", """BackendRequest specifies a timeout for an individual request from
            the gateway to a backend. It must be <= the value of the Request timeout."""),
    ),
    P + "HTTPRouteStatus": t(
        "HTTPRouteStatus defines the observed state of HTTPRoute.",
        parents=f(lst(ref("RouteParentStatus")), """Parents is a list of parent resources (usually
            Gateways) that are associated with the route, and the status of the route with respect to
            each parent."""),
    ),
    P + "RouteParentStatus": t(
        "RouteParentStatus describes the status of a route with respect to an associated Parent.",
        parentRef=f(ref("ParentReference"), "ParentRef corresponds with a ParentRef in the spec that this "
                                            "RouteParentStatus struct describes the status of."),
        controllerName=f("string", "ControllerName is a domain/path string that indicates the name of the "
                                   "controller that wrote this status."),
        conditions=f(_CONDITIONS, """Conditions describes the status of the route with respect to the
            Gateway: Accepted, ResolvedRefs and implementation-specific ones."""),
    ),
}

GROUP = "gateway.networking.k8s.io"
ROOTS: dict[tuple[str, str, str], str] = {
    (GROUP, "v1", "GatewayClass"): P + "GatewayClass",
    (GROUP, "v1", "Gateway"): P + "Gateway",
    (GROUP, "v1", "HTTPRoute"): P + "HTTPRoute",
}
#: The client's models these tables refer to (the generator adds them and what they reach).
EXTERNAL_REFS = ("V1Condition", "V1ObjectMeta", "V1LabelSelector")
