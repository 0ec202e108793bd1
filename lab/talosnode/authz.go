package talosnode

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

var errPermissionDenied = status.Error(codes.PermissionDenied, "not authorized")

// Talos's roles, carried as the Organization of a client certificate.
const (
	roleAdmin    = "os:admin"
	roleOperator = "os:operator"
	roleReader   = "os:reader"
)

// allowedRoles are the roles that may call each method in configured
// mode, after Talos's rules; a method not listed needs os:admin.
var allowedRoles = map[string][]string{
	machine.MachineService_Version_FullMethodName:        {roleAdmin, roleOperator, roleReader},
	machine.MachineService_EtcdMemberList_FullMethodName: {roleAdmin, roleOperator, roleReader},
	machine.MachineService_Logs_FullMethodName:           {roleAdmin, roleOperator, roleReader},
	machine.MachineService_Reboot_FullMethodName:         {roleAdmin, roleOperator},
	machine.MachineService_Shutdown_FullMethodName:       {roleAdmin, roleOperator},
	cosiv1alpha1.State_Get_FullMethodName:                {roleAdmin, roleOperator, roleReader},
	cosiv1alpha1.State_List_FullMethodName:               {roleAdmin, roleOperator, roleReader},
	cosiv1alpha1.State_Watch_FullMethodName:              {roleAdmin, roleOperator, roleReader},
}

// roles are the Talos roles in the verified client certificate.
func roles(ctx context.Context) []string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	var rs []string
	for _, o := range info.State.VerifiedChains[0][0].Subject.Organization {
		if strings.HasPrefix(o, "os:") {
			rs = append(rs, o)
		}
	}
	return rs
}

// authorize checks a call in configured mode: the client's roles must
// allow the method, and node metadata (talosctl --nodes) must name this
// node, since the emulated apid does not proxy to other nodes.
func (n *Node) authorize(ctx context.Context, method string) error {
	allowed, ok := allowedRoles[method]
	if !ok {
		allowed = []string{roleAdmin}
	}
	if !slices.ContainsFunc(roles(ctx), func(r string) bool { return slices.Contains(allowed, r) }) {
		return errPermissionDenied
	}
	md, _ := metadata.FromIncomingContext(ctx)
	for _, key := range []string{"node", "nodes"} {
		for _, v := range md.Get(key) {
			for target := range strings.SplitSeq(v, ",") {
				if !n.isSelf(strings.TrimSpace(target)) {
					return status.Errorf(codes.Unavailable, "the emulated node %s does not proxy requests to node %q; connect to that node directly", n.cfg.Address, target)
				}
			}
		}
	}
	return nil
}

func (n *Node) isSelf(target string) bool {
	n.mu.Lock()
	hostname := n.hostname
	n.mu.Unlock()
	return target == n.cfg.Address.String() || target == hostname
}

// grpcServer is a gRPC server with the node's interceptors: panic
// recovery, request logging and, in configured mode, authorization.
// Maintenance mode lets every caller in with the reader role, as Talos
// does; the handlers then refuse what needs more.
func (n *Node) grpcServer(creds credentials.TransportCredentials, m mode) *grpc.Server {
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if m == configured {
			if err := n.authorize(ctx, info.FullMethod); err != nil {
				n.log.Debug("request refused", "method", info.FullMethod, "err", err)
				return nil, err
			}
		}
		resp, err := handler(ctx, req)
		n.log.Debug("request", "mode", m.String(), "method", info.FullMethod, "code", status.Code(err).String())
		return resp, err
	}
	stream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if m == configured {
			if err := n.authorize(ss.Context(), info.FullMethod); err != nil {
				return err
			}
		}
		err := handler(srv, ss)
		n.log.Debug("stream", "mode", m.String(), "method", info.FullMethod, "code", status.Code(err).String())
		return err
	}
	return grpc.NewServer(
		grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(recoverUnary(n.log), unary),
		grpc.ChainStreamInterceptor(recoverStream(n.log), stream),
	)
}

func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in request", "method", info.FullMethod, "panic", fmt.Sprint(r))
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}

func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in stream", "method", info.FullMethod, "panic", fmt.Sprint(r))
				err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}
