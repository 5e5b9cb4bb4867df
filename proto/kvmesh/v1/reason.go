package kvmeshv1

import "strings"

// ErrorDomain is the domain of the google.rpc.ErrorInfo that nodes attach to
// their INVALID_ARGUMENT, RESOURCE_EXHAUSTED and PERMISSION_DENIED statuses
// (see errors.proto).
const ErrorDomain = "kvmesh.dev"

const reasonPrefix = "ERROR_REASON_"

// Reason returns the ErrorInfo reason of r: its name without the
// ERROR_REASON_ prefix ("QUOTA_EXCEEDED").
func (r ErrorReason) Reason() string { return strings.TrimPrefix(r.String(), reasonPrefix) }

// ParseErrorReason returns the ErrorReason of an ErrorInfo reason, and false
// for a reason this version does not know (a newer node's).
func ParseErrorReason(reason string) (ErrorReason, bool) {
	v, ok := ErrorReason_value[reasonPrefix+reason]
	if !ok || v == 0 {
		return ErrorReason_ERROR_REASON_UNSPECIFIED, false
	}
	return ErrorReason(v), true
}
