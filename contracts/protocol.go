package contracts

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"code.foss.global/serve.zone/relay/contracts/strictjson"
)

// The protocol handshake (seed-defined: docs/protocol.md#protocol-handshake).

// InterfacesVersion is the newest @serve.zone/interfaces release this relay implements. It is
// the relay's protocol version; the relay build version is a different fact.
const InterfacesVersion = "32.36.0"

// MinimumPeerVersion is the oldest peer release the relay accepts on every session kind it serves.
// A deployable that depends on nothing newer than its own major accepts that whole major.
const MinimumPeerVersion = "32.0.0"

// RefusedOfferRetryInterval is refusedOfferRetryIntervalMs (300 000 ms): the cadence at which a
// refused client offers again.
const RefusedOfferRetryInterval = 300_000 * time.Millisecond

// ProtocolIncompatibleCode is the frozen code of every IProtocolRefusal.
const ProtocolIncompatibleCode = "protocol-incompatible"

// ProtocolIncompatibility is TProtocolIncompatibility.
type ProtocolIncompatibility string

// The incompatibilities, in the fixed order negotiateProtocol checks them.
const (
	MajorMismatch        ProtocolIncompatibility = "major-mismatch"
	PeerBelowMinimum     ProtocolIncompatibility = "peer-below-minimum"
	SelfBelowPeerMinimum ProtocolIncompatibility = "self-below-peer-minimum"
)

var protocolIncompatibilities = [...]ProtocolIncompatibility{MajorMismatch, PeerBelowMinimum, SelfBelowPeerMinimum}

// ProtocolIncompatibilities lists the incompatibilities in the seed's order (a copy: the
// vocabulary is frozen).
func ProtocolIncompatibilities() [3]ProtocolIncompatibility { return protocolIncompatibilities }

// Version is a release version: MAJOR.MINOR.PATCH and nothing else.
type Version struct{ Major, Minor, Patch uint64 }

// ParseVersion reads a release version. No prerelease, build metadata, "v" prefix or leading
// zeros; each component is at most a safe integer.
func ParseVersion(s string) (Version, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("version must be MAJOR.MINOR.PATCH")
	}
	var n [3]uint64
	for i, p := range parts {
		if p == "" || len(p) > 16 || (len(p) > 1 && p[0] == '0') {
			return Version{}, fmt.Errorf("version must be MAJOR.MINOR.PATCH")
		}
		for j := 0; j < len(p); j++ {
			if p[j] < '0' || p[j] > '9' {
				return Version{}, fmt.Errorf("version must be MAJOR.MINOR.PATCH")
			}
		}
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil || v > strictjson.MaxSafeInteger {
			return Version{}, fmt.Errorf("version must be MAJOR.MINOR.PATCH")
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

// IsReleaseVersion reports whether s is a release version.
func IsReleaseVersion(s string) bool {
	_, err := ParseVersion(s)
	return err == nil
}

// Compare orders versions per numeric component: 32.10.0 is above 32.9.0.
func (v Version) Compare(o Version) int {
	for _, d := range [...][2]uint64{{v.Major, o.Major}, {v.Minor, o.Minor}, {v.Patch, o.Patch}} {
		if d[0] != d[1] {
			if d[0] < d[1] {
				return -1
			}
			return 1
		}
	}
	return 0
}

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// ProtocolOffer is IProtocolOffer: what a side speaks and the oldest peer it accepts.
type ProtocolOffer struct {
	InterfacesVersion  string `json:"interfacesVersion"`
	MinimumPeerVersion string `json:"minimumPeerVersion"`
}

// CreateProtocolOffer builds an offer for the installed release. A minimum above the installed
// release, or in another major, is an error here — at start-up, not at the first registration.
func CreateProtocolOffer(installed, minimum string) (ProtocolOffer, error) {
	o := ProtocolOffer{InterfacesVersion: installed, MinimumPeerVersion: minimum}
	if reasons := o.validate("protocol offer"); len(reasons) > 0 {
		return ProtocolOffer{}, errors.New(strings.Join(reasons, "; "))
	}
	return o, nil
}

// RelayOffer is the relay's own offer, used on every session kind it serves and every one it opens.
var RelayOffer = mustOffer(InterfacesVersion, MinimumPeerVersion)

func mustOffer(installed, minimum string) ProtocolOffer {
	o, err := CreateProtocolOffer(installed, minimum)
	if err != nil {
		panic(err)
	}
	return o
}

// MarshalJSON writes the offer with its two members in the seed order.
func (o ProtocolOffer) MarshalJSON() ([]byte, error) {
	b := append(make([]byte, 0, 64), `{"interfacesVersion":`...)
	b = strictjson.AppendString(b, o.InterfacesVersion)
	b = append(b, `,"minimumPeerVersion":`...)
	b = strictjson.AppendString(b, o.MinimumPeerVersion)
	return append(b, '}'), nil
}

func (o ProtocolOffer) validate(path string) []string {
	var reasons []string
	iv, errI := ParseVersion(o.InterfacesVersion)
	if errI != nil {
		reasons = append(reasons, path+" interfacesVersion must be a release version")
	}
	mv, errM := ParseVersion(o.MinimumPeerVersion)
	if errM != nil {
		reasons = append(reasons, path+" minimumPeerVersion must be a release version")
	}
	if errI == nil && errM == nil {
		if mv.Major != iv.Major {
			reasons = append(reasons, path+" minimumPeerVersion must be in the major of interfacesVersion")
		} else if mv.Compare(iv) > 0 {
			reasons = append(reasons, path+" minimumPeerVersion must not be above interfacesVersion")
		}
	}
	return reasons
}

// ValidateProtocolOffer names every reason the JSON value raw is not an offer; empty for a valid
// one. path defaults to "protocol offer". An offer must be an object with exactly the two string
// members; anything else "must use its exact schema".
func ValidateProtocolOffer(raw []byte, path string) []string {
	if path == "" {
		path = "protocol offer"
	}
	_, reasons := readProtocolOffer(raw, path)
	return reasons
}

// readProtocolOffer reads an offer value exactly and judges its versions, one reason per
// violation.
func readProtocolOffer(raw []byte, path string) (ProtocolOffer, []string) {
	o, ok := readOffer(raw)
	if !ok {
		return ProtocolOffer{}, []string{path + " must use its exact schema"}
	}
	if reasons := o.validate(path); len(reasons) > 0 {
		return ProtocolOffer{}, reasons
	}
	return o, nil
}

// ValidateProtocolOfferOn names every reason the protocol key of the JSON object body is not an
// offer, read as plain data. path defaults to "body".
func ValidateProtocolOfferOn(body []byte, path string) []string {
	if path == "" {
		path = "body"
	}
	_, reasons := readProtocolOfferOn(body, path)
	return reasons
}

func readProtocolOfferOn(body []byte, path string) (ProtocolOffer, []string) {
	raw, ok, err := strictjson.Lookup(body, "protocol")
	if err != nil || !ok {
		return ProtocolOffer{}, []string{path + " protocol must use its exact schema"}
	}
	return readProtocolOffer(raw, path+" protocol")
}

// ReadProtocolOffer reads the offer on a body from its protocol key alone. A body that is not an
// object, a missing or repeated protocol key, or an offer that is not exactly two release
// versions is refused with an *InvalidError naming each reason.
func ReadProtocolOffer(body []byte) (ProtocolOffer, error) {
	o, reasons := readProtocolOfferOn(body, "body")
	if len(reasons) > 0 {
		return ProtocolOffer{}, &InvalidError{Reasons: reasons}
	}
	return o, nil
}

// readOffer reads raw as an object with exactly interfacesVersion and minimumPeerVersion, both
// strings. It does not judge the versions.
func readOffer(raw []byte) (ProtocolOffer, bool) {
	var iv, mv []byte
	if strictjson.ReadExact(raw, strictjson.Req("interfacesVersion", &iv), strictjson.Req("minimumPeerVersion", &mv)) != nil {
		return ProtocolOffer{}, false
	}
	i, err1 := strictjson.ReadString(iv)
	m, err2 := strictjson.ReadString(mv)
	if err1 != nil || err2 != nil {
		return ProtocolOffer{}, false
	}
	return ProtocolOffer{InterfacesVersion: i, MinimumPeerVersion: m}, true
}

// ProtocolRefusal is IProtocolRefusal, carried as the error's data.
//
// Project-defined: Refusing is the offer of the side that refuses, Refused the offer it
// refused.
type ProtocolRefusal struct {
	Code     string                  `json:"code"`
	Reason   ProtocolIncompatibility `json:"reason"`
	Refusing ProtocolOffer           `json:"refusing"`
	Refused  ProtocolOffer           `json:"refused"`
}

// NegotiateProtocol judges a remote offer against the local one, in the seed's fixed order. It
// returns nil when the two are compatible. Offers that do not name release versions are a local
// defect and an error: read a peer's offer with ReadProtocolOffer first.
func NegotiateProtocol(local, remote ProtocolOffer) (*ProtocolRefusal, error) {
	if r := local.validate("local offer"); len(r) > 0 {
		return nil, errors.New(strings.Join(r, "; "))
	}
	if r := remote.validate("remote offer"); len(r) > 0 {
		return nil, errors.New(strings.Join(r, "; "))
	}
	li, _ := ParseVersion(local.InterfacesVersion)
	lm, _ := ParseVersion(local.MinimumPeerVersion)
	ri, _ := ParseVersion(remote.InterfacesVersion)
	rm, _ := ParseVersion(remote.MinimumPeerVersion)
	var reason ProtocolIncompatibility
	switch {
	case li.Major != ri.Major:
		reason = MajorMismatch
	case ri.Compare(lm) < 0:
		reason = PeerBelowMinimum
	case li.Compare(rm) < 0:
		reason = SelfBelowPeerMinimum
	default:
		return nil, nil
	}
	return &ProtocolRefusal{Code: ProtocolIncompatibleCode, Reason: reason, Refusing: local, Refused: remote}, nil
}

// DescribeProtocolRefusal is one log line naming both sides, opening with protocol-incompatible.
// It is also the error text a refusal is sent with.
func DescribeProtocolRefusal(r ProtocolRefusal) string {
	return fmt.Sprintf("%s: %s: the refusing side speaks %s and accepts peers from %s; the refused side speaks %s and accepts peers from %s",
		ProtocolIncompatibleCode, r.Reason,
		r.Refusing.InterfacesVersion, r.Refusing.MinimumPeerVersion,
		r.Refused.InterfacesVersion, r.Refused.MinimumPeerVersion)
}

// Error makes a refusal an error whose text is DescribeProtocolRefusal.
func (r *ProtocolRefusal) Error() string { return DescribeProtocolRefusal(*r) }

// Data is the refusal as the error data it travels as.
func (r *ProtocolRefusal) Data() json.RawMessage {
	b, _ := json.Marshal(r)
	return b
}

// ReadProtocolRefusal reads the refusal inside an error's data, or ok == false when the value is
// not one. It reads plain data with exact keys and valid offers only.
func ReadProtocolRefusal(raw []byte) (ProtocolRefusal, bool) {
	var code, reason, refusing, refused []byte
	if strictjson.ReadExact(raw, strictjson.Req("code", &code), strictjson.Req("reason", &reason), strictjson.Req("refusing", &refusing), strictjson.Req("refused", &refused)) != nil {
		return ProtocolRefusal{}, false
	}
	if s, err := strictjson.ReadString(code); err != nil || s != ProtocolIncompatibleCode {
		return ProtocolRefusal{}, false
	}
	why, err := strictjson.ReadString(reason)
	if err != nil || !isIncompatibility(why) {
		return ProtocolRefusal{}, false
	}
	r := ProtocolRefusal{Code: ProtocolIncompatibleCode, Reason: ProtocolIncompatibility(why)}
	var reasons []string
	if r.Refusing, reasons = readProtocolOffer(refusing, ""); len(reasons) > 0 {
		return ProtocolRefusal{}, false
	}
	if r.Refused, reasons = readProtocolOffer(refused, ""); len(reasons) > 0 {
		return ProtocolRefusal{}, false
	}
	return r, true
}

func isIncompatibility(s string) bool {
	for _, i := range protocolIncompatibilities {
		if string(i) == s {
			return true
		}
	}
	return false
}
