/* Suspicion and probes (docs/protocol.md, "Suspicion and probes"): a node that
 * vanishes without closing its connection is found within about a second, not
 * at the heartbeat timeout, when the job itself points at it. Launchers say in
 * their heartbeats when all their workers wait inside one collective
 * (RDZV_HEARTBEAT_WAIT); once at least as many nodes of a running round wait
 * as do not, and at most RDZV_PROBE_MAX_SUSPECTS do not, those are the nodes
 * the others wait for: each is sent a PING and must answer PONG within its
 * probe deadline. An answer clears it (a slow node is not a lost one). No
 * answer ends the round as a lost heartbeat does, with the evidence (who
 * waited, for how long, its last heartbeat, the deadline) in the message, but
 * only while the round is blocked on it: every other node still waits, or is
 * a suspect that did not answer either. A collective that completes proves
 * its nodes' workers alive, whatever their launchers do: a straggler that
 * answered, or a node whose launcher alone stopped, ends no round.
 * Every node is pinged once when it joins, so that its deadline follows its
 * round-trip time from the first suspicion on.
 * A suspect silent a third into its deadline is also probed through up to
 * RDZV_PROBE_RELAYS other nodes of its round that have a UDP port for peer
 * probes (RDZV_PROBE_REQ; rdzv_peer.c is their side): any of them reaching
 * it clears it as its own answer would, so that a link bad between the
 * server and one node alone condemns no node; the verdict waits for their
 * answers (at most RDZV_RELAY_GRACE_MS past the deadline) and names them.
 * Kernel probes (RDZV_PROBES_ON; rule 8): a node whose launcher said it
 * listens on TCP on its peer port's number (RDZV_JOIN_KERNEL) has that port
 * checked once its round runs, by a peer on another host where there is one
 * (a machine check, PROBE_REQ with RDZV_PROBE_MACHINE); a checked node silent
 * past its worst gap + RDZV_EARLY_STALL_MS (at least RDZV_EARLY_MIN_MS) is
 * probed early, directly and through up to RDZV_PROBE_RELAYS checked peers
 * that ping it and connect to its machine (RDZV_PROBE_KERNEL): its checker
 * (the peer that reached its port last) and others that showed they can
 * connect out (they reached a peer's port), with a deadline that covers
 * their round trips too. Its machine answering (a stopped or starved
 * launcher) leaves it to the rules above; it is lost early only when at
 * least RDZV_EARLY_NACKS of them, its checker among them, reached neither it
 * nor its machine. A port reached is checked again every
 * RDZV_CHECK_PASSED_MS. Part of the server: runs
 * on its loop, owned by rdzv_server.c (the sweep) and rdzv_job.c (members). */
#ifndef GPULAUNCH_RDZV_PROBE_H
#define GPULAUNCH_RDZV_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "rdzv_codec.h"

#define RDZV_PROBE_MIN_MS 250     /* a probe's deadline: at least this ... */
#define RDZV_PROBE_RTT_FACTOR 3   /* ... and this many times the node's worst recent round trip */
#define RDZV_PROBE_MAX_MS 2000    /* ... and never more than this */
#define RDZV_PROBE_MAX_SUSPECTS 8 /* more nodes not waiting: the job waits for no one node */
#define RDZV_PROBE_AGAIN_MS 250   /* a suspect that answered is not probed again sooner */
#define RDZV_PROBE_WAIT_MAX_MS 3600000 /* a wait said longer than this is taken as this */
#define RDZV_PROBE_SAY_MS 60000        /* a suspect that answered is logged at most this often */
#define RDZV_PROBE_RELAYS 3   /* peers asked to probe a suspect silent a third into its deadline */
#define RDZV_RELAY_MIN_MS 100 /* their deadline: what is left of the suspect's, at least this */
#define RDZV_RELAY_GRACE_MS 250 /* the verdict waits this long past the deadline for their word */
/* Silence without the job's word: a node of a running round that sent
 * nothing for its worst recent gap between frames + RDZV_SILENCE_STALL_MS
 * (at least RDZV_SILENCE_MIN_MS) is probed the same way, before the
 * heartbeat timeout; one whose threshold comes within RDZV_PROBE_MAX_MS of
 * the timeout is left to it. */
#define RDZV_SILENCE_STALL_MS 1500 /* a launcher's stall (SIGSTOP, swap, a long fork): no loss */
#define RDZV_SILENCE_MIN_MS 2500
#define RDZV_GAP_DECAY 16 /* the worst gap decays by 1/16 a frame */
/* The heartbeat timeout asks the peers too: a node left to the timeout is
 * probed RDZV_TIMEOUT_ASK_MS before it, directly and through its peers at
 * once, and the timeout ends its round only when neither reached it. A node
 * its peers reach (its link to the rendezvous alone is slow or lossy) is
 * kept while they keep reaching it (probed again every RDZV_PEER_AGAIN_MS),
 * up to RDZV_PEER_KEEP_FACTOR x the timeout of silence to the rendezvous:
 * past that the rendezvous cannot tell it of a round's end, and it is lost. */
#define RDZV_TIMEOUT_ASK_MS 2250
/* Their window: what is left until the timeout, at least
 * RDZV_TIMEOUT_RELAY_MIN_MS, and at least a launcher's stall
 * (RDZV_SILENCE_STALL_MS) + RDZV_PROBE_RTT_FACTOR x the slowest asked peer's
 * worst round trip (the request's way to it, its probes' to the node and
 * back, its word's back: a node stopped for a stall must still answer in
 * it), at most RDZV_TIMEOUT_RELAY_MAX_MS. The verdict waits for their word
 * that window + that round trip + RDZV_RELAY_GRACE_MS after they were asked
 * (so the timeout can pass first on a slow link). */
#define RDZV_TIMEOUT_RELAY_MIN_MS 1750
#define RDZV_TIMEOUT_RELAY_MAX_MS 4000
#define RDZV_PEER_AGAIN_MS 1000
#define RDZV_PEER_KEEP_FACTOR RDZV_KEEP_FACTOR /* rdzv_codec.h: the client's bound too */
/* Kernel probes: the early silence threshold, the peers' word it needs, and
 * the machine check's deadline, its retry after no word or a prober that
 * could not try, and its next try after a port found unreachable. */
#define RDZV_EARLY_STALL_MS 250
#define RDZV_EARLY_MIN_MS 1250
#define RDZV_EARLY_NACKS 2
#define RDZV_CHECK_MS 2000
#define RDZV_CHECK_RETRY_MS 5000
#define RDZV_CHECK_AGAIN_MS 60000
/* A port reached is checked again this often (the path may have closed
 * since), and sooner, after RDZV_CHECK_RETRY_MS, when only a peer on its own
 * host reached it while the round has other hosts. */
#define RDZV_CHECK_PASSED_MS 60000
/* A peer that never reached a port and says a check did not reach one may
 * be a peer whose own TCP does not leave its host: its word alone does not
 * make a port unreached; that of a peer that reached one does, or the
 * words of this many such peers, one after the other. */
#define RDZV_CHECK_NOS 2

typedef struct conn conn;
typedef struct member member;
typedef struct rdzv_server rdzv_server;

/* A member's probe state, embedded in it (zero: nothing known). */
typedef struct rdzv_probe {
    uint64_t wait_from_ms;  /* its workers wait in a collective since (server clock); 0: not */
    uint64_t sent_ms;       /* the probe in flight was sent at; 0: none */
    uint64_t cleared_ms;    /* it last answered a suspicion's probe */
    uint64_t said_ms;       /* the log last said so */
    uint32_t id;            /* the req id of the probe in flight */
    uint32_t rtt_ms;        /* its worst recent round trip (decays by 1/8 a probe) */
    uint32_t gap_ms;        /* its worst recent gap between frames (RDZV_GAP_DECAY) */
    int answers;            /* its JOIN said RDZV_JOIN_PROBE */
    int suspected;          /* the probe in flight is a suspicion's: RDZV_SUSPECT_* (0: the join's
                               calibration) */
    int listed;             /* on the server's list of probes in flight (member.plink) */
    uint16_t peer_port;     /* its UDP port for peer probes (RDZV_JOIN_PEER); 0: none */
    char peer_ip[48];       /* its address as this server sees it, for the peers' probes */
    uint32_t relayed;       /* peers asked to probe it for the probe in flight */
    uint32_t relay_nacks;   /* of them, those that said they could not reach it */
    uint32_t relay_ms;      /* the deadline they were given */
    uint32_t relay_wait_ms; /* their word is waited for this long after they were asked */
    char relay_names[96];   /* the first of them by name, for the verdict */
    uint64_t relay_at_ms;   /* when they were asked */
    uint64_t peer_kept_ms;  /* a peer's probe last reached it (0: never) */
    char unreached[128];    /* the peers whose probes before the timeout did not reach it ("":
                               none asked, or one reached it since) */
    uint64_t missed_ms;     /* the last suspicion's ping of this silence past its deadline
                               unanswered was sent at (0: none; a frame clears it) */
    uint32_t missed_n;      /* such pings in this silence */
    uint32_t relay_machine; /* of the peers asked, those that reached only its machine (TCP) */
    uint32_t relay_unable;  /* ... and those that could not probe */
    int early_done;         /* this silence's early probe was made (cleared by a frame) */
    int kernel;             /* its JOIN said RDZV_JOIN_KERNEL */
    int machine;            /* its kernel-probe port: 1 reached by a peer, -1 not, 0 unchecked */
    int reaches;            /* 1: it reached a peer's kernel-probe port (it can connect out); -1: it
                               reached none and said of one that it did not (it may not connect out);
                               0: not known */
    int check_nos;          /* checks of its port that peers not known to connect out said did not
                               reach it, since one last did (RDZV_CHECK_NOS of them: not reached) */
    int check_said;         /* a check that did not reach it was logged */
    uint64_t serial;        /* this member, among every member the server had (never 0) */
    uint64_t checker;       /* the serial of the peer that last reached its port (0: none) */
    int checker_nack;       /* that peer said 0 (neither reached) for the probe in flight */
    uint32_t check_id;      /* the machine check in flight (0: none) */
    uint64_t check_sent_ms, check_at_ms; /* it was sent at; the next is due at */
} rdzv_probe;

/* WAITED: the others wait for it in a collective; SILENT: silent past its
 * own threshold; TIMEOUT: silent near the heartbeat timeout, which judges;
 * EARLY: silent past the kernel probes' threshold */
enum {
    RDZV_SUSPECT_WAITED = 1,
    RDZV_SUSPECT_SILENT = 2,
    RDZV_SUSPECT_TIMEOUT = 3,
    RDZV_SUSPECT_EARLY = 4
};

/* A frame from m's node came, gap_ms after the one before. */
void rdzv__probe_rx(member *m, uint64_t gap_ms);
/* The heartbeat sweep, for each node of a running round: probes it when it
 * is silent past its threshold. */
void rdzv__probe_silent(member *m, uint64_t now);
/* The heartbeat sweep, for each node of a running round: checks that a peer
 * reaches its kernel-probe port, when due. */
void rdzv__probe_machine(member *m, uint64_t now);
/* A JOIN was taken: whether the node answers probes; it is pinged once to
 * learn its round trip. */
void rdzv__probe_joined(conn *c, const rdzv_msg *join);
/* A heartbeat with RDZV_HEARTBEAT_WAIT from c's node. */
void rdzv__probe_heartbeat(conn *c, const rdzv_msg *msg);
/* A PONG from c's node. */
void rdzv__probe_pong(conn *c, const rdzv_msg *msg);
/* A PROBE_ACK from c's node: what its probe of a suspect found. */
void rdzv__probe_ack(conn *c, const rdzv_msg *msg);
/* The heartbeat sweep, for a node silent past the timeout: 1 when it is
 * kept (its peers reach it, or their word on it is still to come), else 0
 * with what its probes found in evidence, to follow "sent no heartbeat for
 * X s (timeout Y s)" ("" when it was neither pinged nor its peers asked). */
int rdzv__probe_kept(member *m, uint64_t now, char *evidence, size_t len);
/* c's member goes: off the server's list. */
void rdzv__probe_gone(member *m);
/* The sweep: probes past their deadline end their rounds. */
void rdzv__probe_sweep(rdzv_server *s, uint64_t now);

#endif
