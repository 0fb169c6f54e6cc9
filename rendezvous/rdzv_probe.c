/* Suspicion and probes: rdzv_probe.h says what and why. */
#include "rdzv_probe.h"

#include <stdio.h>
#include <string.h>

#include "gb_log.h"
#include "gb_time.h"
#include "rdzv_server_int.h"

#define GB_COMPONENT "rdzv"

static void unlist(member *m) {
    if (m->p.suspected && m->p.sent_ms)
        m->c->s->m.probes_moot++; /* unless counted as answered or unanswered first */
    if (m->p.listed) {
        LIST_REMOVE(m, plink);
        m->p.listed = 0;
    }
    m->p.sent_ms = 0;
    m->p.suspected = 0;
    m->p.relayed = m->p.relay_nacks = m->p.relay_machine = m->p.relay_unable = 0;
    m->p.checker_nack = 0;
    m->p.relay_names[0] = '\0';
}

/* The peers asked that have said what they found. */
static uint32_t relay_heard(const member *m) {
    return m->p.relay_nacks + m->p.relay_machine + m->p.relay_unable;
}

static void ping(member *m, uint64_t now, int suspected) {
    rdzv_server *s = m->c->s;
    if (++s->probe_id == 0)
        s->probe_id = 1;
    m->p.id = s->probe_id;
    m->p.sent_ms = now ? now : 1;
    m->p.suspected = suspected;
    m->p.relayed = m->p.relay_nacks = m->p.relay_machine = m->p.relay_unable = 0;
    m->p.checker_nack = 0;
    m->p.relay_names[0] = '\0';
    if (!m->p.listed) {
        LIST_INSERT_HEAD(&s->probing, m, plink);
        m->p.listed = 1;
    }
    rdzv_msg p = {.type = RDZV_PING, .req_id = m->p.id};
    rdzv__send_msg(m->c, &p);
    if (suspected)
        s->m.probes_sent++;
}

/* The deadline of a probe of m now (ms). */
static uint32_t deadline_ms(const member *m) {
    if (m->p.rtt_ms == 0)
        return RDZV_PROBE_MAX_MS; /* its round trip unknown (the join's ping unanswered yet):
                                     a slow link is not condemned by the LAN's deadline */
    uint64_t d = (uint64_t)m->p.rtt_ms * RDZV_PROBE_RTT_FACTOR;
    if (d < RDZV_PROBE_MIN_MS)
        d = RDZV_PROBE_MIN_MS;
    return d > RDZV_PROBE_MAX_MS ? RDZV_PROBE_MAX_MS : (uint32_t)d;
}

void rdzv__probe_joined(conn *c, const rdzv_msg *join) {
    member *m = c->m;
    if (m == NULL)
        return;
    if (m->p.serial == 0)
        m->p.serial = ++c->s->member_serial;
    m->p.answers = (join->flags & RDZV_JOIN_PROBE) != 0;
    m->p.wait_from_ms = 0; /* a new round: its workers wait in none of its collectives yet */
    uint16_t was = m->p.peer_port;
    int kernel = m->p.kernel;
    m->p.peer_port = (join->flags & RDZV_JOIN_PEER) ? join->u.join.peer_port : 0;
    if (m->p.peer_port) { /* "ip:port" as the server sees it: the ip */
        snprintf(m->p.peer_ip, sizeof m->p.peer_ip, "%s", rdzv__peer_of(c));
        char *colon = strrchr(m->p.peer_ip, ':');
        if (colon == NULL || colon == m->p.peer_ip)
            m->p.peer_port = 0;
        else
            *colon = '\0';
    }
    m->p.kernel = m->p.peer_port && (join->flags & RDZV_JOIN_KERNEL);
    if (m->p.peer_port != was || m->p.kernel != kernel) { /* another port: checked again */
        m->p.machine = 0;
        m->p.check_id = 0;
        m->p.check_at_ms = 0;
        m->p.check_said = 0;
        m->p.check_nos = 0;
        m->p.checker = 0;
    }
    if (m->p.answers && m->p.rtt_ms == 0 && m->p.sent_ms == 0)
        ping(m, gb_now_ms(), 0); /* calibration: its round trip, before it is ever suspected */
}

/* The running round's nodes that the others wait for: at least as many wait
 * as do not, and at most RDZV_PROBE_MAX_SUSPECTS do not. Each is probed
 * unless a suspicion's probe of it is in flight or it answered one just now. */
static void suspect(job *j, uint64_t now) {
    rdzv_round *r = &j->r;
    if (r->state != RDZV_R_RUNNING)
        return;
    member *idle[RDZV_PROBE_MAX_SUSPECTS];
    uint32_t waiting = 0, nidle = 0;
    for (uint32_t i = 0; i < r->nranks; i++) {
        rdzv_rmember *rm = r->ranks[i];
        if (rm == NULL || rm->done)
            continue;
        member *m = member_of(rm);
        if (m->p.wait_from_ms)
            waiting++;
        else if (nidle++ < RDZV_PROBE_MAX_SUSPECTS)
            idle[nidle - 1] = m;
    }
    if (nidle == 0 || nidle > RDZV_PROBE_MAX_SUSPECTS || waiting < nidle)
        return;
    for (uint32_t i = 0; i < nidle; i++) {
        member *m = idle[i];
        if (!m->p.answers || (m->p.sent_ms && m->p.suspected) ||
            (m->p.cleared_ms && now - m->p.cleared_ms < RDZV_PROBE_AGAIN_MS))
            continue;
        GB_DEBUG("job %s: %u node(s) wait for %s in a collective: probing it", r->run_id, waiting,
                 m->rm.hostname);
        ping(m, now, RDZV_SUSPECT_WAITED);
    }
}

void rdzv__probe_heartbeat(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m == NULL || m->rm.r == NULL || !m->rm.active)
        return;
    uint64_t now = gb_now_ms();
    uint64_t w = msg->u.heartbeat.wait_ms;
    if (w > RDZV_PROBE_WAIT_MAX_MS)
        w = RDZV_PROBE_WAIT_MAX_MS;
    if (w == 0) {
        m->p.wait_from_ms = 0;
        return;
    }
    m->p.wait_from_ms = now > w ? now - w : 1;
    suspect(job_of(m->rm.r), now);
}

void rdzv__probe_rx(member *m, uint64_t gap_ms) {
    m->p.peer_kept_ms = 0; /* heard from: kept by its own word, not its peers' */
    m->p.early_done = 0;   /* a new silence may be probed early */
    m->p.unreached[0] = '\0';
    m->p.missed_ms = 0; /* its pings unanswered in the silence before: moot now */
    m->p.missed_n = 0;
    uint64_t most = m->rm.r ? m->rm.r->hb_timeout_ms : RDZV_DEFAULT_HEARTBEAT_TIMEOUT_MS;
    uint32_t gap = (uint32_t)(gap_ms > most ? most : gap_ms); /* longer: dropped anyway */
    uint32_t decayed = m->p.gap_ms - m->p.gap_ms / RDZV_GAP_DECAY;
    m->p.gap_ms = gap > decayed ? gap : decayed;
}

/* m's silence threshold (ms): UINT32_MAX when the heartbeat timeout comes first. */
static uint32_t silence_ms(const member *m) {
    if (m->rm.r == NULL || m->p.gap_ms == 0)
        return UINT32_MAX; /* nothing known of its gaps yet */
    uint64_t t = (uint64_t)m->p.gap_ms + RDZV_SILENCE_STALL_MS;
    if (t < RDZV_SILENCE_MIN_MS)
        t = RDZV_SILENCE_MIN_MS;
    return t + RDZV_PROBE_MAX_MS >= m->rm.r->hb_timeout_ms ? UINT32_MAX : (uint32_t)t;
}

/* Whether x takes part in kernel probes of its round now: a launcher that
 * makes them (its JOIN said so), in the round and not itself suspected. */
static int kernel_peer(const member *x) {
    return x->p.kernel && x->p.peer_port && x->rm.active && !x->rm.done &&
           !(x->p.sent_ms && x->p.suspected);
}

/* Whether x can make a kernel probe of a node of its round: a launcher
 * that makes them (its JOIN said so) and showed that it can connect out (it
 * reached a peer's port), in the round and not itself suspected. */
static int kernel_prober(const member *x) { return x->p.reaches == 1 && kernel_peer(x); }

/* The member of r with this serial; NULL when it is not in r (or 0). */
static member *by_serial(const rdzv_round *r, uint64_t serial) {
    for (uint32_t i = 0; serial && i < r->nranks; i++)
        if (r->ranks[i] && member_of(r->ranks[i])->p.serial == serial)
            return member_of(r->ranks[i]);
    return NULL;
}

/* Up to RDZV_PROBE_RELAYS peers of m's round to probe it, into xs: those
 * with a UDP port that are not themselves suspected, on another host than m
 * first, starting at `from` so that one node is not everyone's prober. For
 * a kernel probe only kernel probers, m's checker first, and none when its
 * checker cannot probe (only a peer that reached m's port can say that it
 * no longer does). */
static uint32_t pick_relays(const member *m, uint32_t from, int kernel,
                            member *xs[RDZV_PROBE_RELAYS]) {
    const rdzv_round *r = m->rm.r;
    uint32_t n = 0;
    if (kernel) {
        member *c = by_serial(r, m->p.checker);
        if (c == NULL || c == m || !kernel_prober(c))
            return 0;
        xs[n++] = c;
    }
    for (int other_host = 1; other_host >= 0 && n < RDZV_PROBE_RELAYS; other_host--)
        for (uint32_t k = 0; k < r->nranks && n < RDZV_PROBE_RELAYS; k++) {
            rdzv_rmember *rm = r->ranks[(k + from) % r->nranks];
            if (rm == NULL || rm == &m->rm || rm->done || !rm->active)
                continue;
            member *x = member_of(rm);
            int same = strcmp(x->rm.hostname, m->rm.hostname) == 0;
            if (x->p.peer_port == 0 || (x->p.sent_ms && x->p.suspected) || same == other_host ||
                (kernel && (!kernel_prober(x) || x->p.serial == m->p.checker)))
                continue;
            xs[n++] = x;
        }
    return n;
}

/* The peers' deadline for an early probe of m through xs: m's own, or
 * RDZV_PROBE_RTT_FACTOR x (its round trip + the slowest peer's) when that
 * is longer (a peer far from it), at most RDZV_PROBE_MAX_MS. */
static uint32_t early_ms(const member *m, member *const *xs, uint32_t n) {
    uint32_t d = deadline_ms(m), worst = m->p.rtt_ms;
    for (uint32_t i = 0; i < n; i++)
        if (xs[i]->p.rtt_ms == 0 || xs[i]->p.rtt_ms > worst)
            worst = xs[i]->p.rtt_ms ? xs[i]->p.rtt_ms : RDZV_PROBE_MAX_MS;
    uint64_t w = (uint64_t)RDZV_PROBE_RTT_FACTOR * ((uint64_t)m->p.rtt_ms + worst);
    if (m->p.rtt_ms == 0 || w > RDZV_PROBE_MAX_MS)
        return RDZV_PROBE_MAX_MS;
    return w > d ? (uint32_t)w : d;
}

/* Whether m, silent for `silent` ms, is due for its early probe now: kernel
 * probes on, its own port checked, silent past its early threshold, at
 * least RDZV_EARLY_NACKS peers that can make kernel probes of it (its
 * checker among them; chosen into xs, *n), and the probe settled (the
 * peers' deadline and grace) before the heartbeat timeout's own ask. */
static int early_due(const member *m, uint64_t silent, member *xs[RDZV_PROBE_RELAYS], uint32_t *n) {
    const rdzv_round *r = m->rm.r;
    *n = 0;
    if (m->c->s->o.probes != RDZV_PROBES_ON || m->p.machine != 1 || m->p.early_done ||
        m->p.peer_kept_ms || m->p.gap_ms == 0)
        return 0;
    uint64_t t = (uint64_t)m->p.gap_ms + RDZV_EARLY_STALL_MS;
    if (t < RDZV_EARLY_MIN_MS)
        t = RDZV_EARLY_MIN_MS;
    if (silent < t)
        return 0;
    *n = pick_relays(m, (uint32_t)m->p.serial, 1, xs);
    return *n >= RDZV_EARLY_NACKS &&
           t + early_ms(m, xs, *n) + RDZV_RELAY_GRACE_MS + RDZV_TIMEOUT_ASK_MS <= r->hb_timeout_ms;
}

static void relay(member *m, uint64_t now, member *const *xs, uint32_t n);

void rdzv__probe_silent(member *m, uint64_t now) {
    if (!m->p.answers || (m->p.sent_ms && m->p.suspected) || m->rm.r == NULL)
        return;
    uint64_t silent = now - m->c->last_rx_ms, hb = m->rm.r->hb_timeout_ms;
    uint32_t t = silence_ms(m), n = 0;
    member *xs[RDZV_PROBE_RELAYS];
    int kind = RDZV_SUSPECT_SILENT;
    if (silent < t && early_due(m, silent, xs, &n)) {
        kind = RDZV_SUSPECT_EARLY; /* once in this silence */
        m->p.early_done = 1;
    } else if (t == UINT32_MAX || (m->p.peer_kept_ms && silent >= t)) {
        /* left to the timeout, or kept by its peers: they are asked before it */
        if (m->p.peer_port == 0 || hb <= RDZV_TIMEOUT_ASK_MS || silent < hb - RDZV_TIMEOUT_ASK_MS)
            return;
        if (m->p.peer_kept_ms && now - m->p.peer_kept_ms < RDZV_PEER_AGAIN_MS)
            return;
        if (m->p.unreached[0])
            return; /* its peers were asked in this silence and did not reach it: the timeout
                       judges (asking again would put the verdict off for ever) */
        kind = RDZV_SUSPECT_TIMEOUT;
    } else if (silent < t) {
        return;
    }
    GB_DEBUG("job %s: %s sent nothing for %.1f s: probing it%s", m->rm.r->run_id, m->rm.hostname,
             (double)silent / 1000.0,
             kind == RDZV_SUSPECT_TIMEOUT ? " and asking its peers"
             : kind == RDZV_SUSPECT_EARLY ? " and its machine through its peers"
                                          : "");
    ping(m, now, kind);
    if (kind == RDZV_SUSPECT_TIMEOUT || kind == RDZV_SUSPECT_EARLY)
        relay(m, now, kind == RDZV_SUSPECT_EARLY ? xs : NULL,
              n); /* at once: their word must come before the timeout, or is the point */
}

/* " and answered no ping within D ms (N in this silence)": the pings of m
 * unanswered in this silence, the one in flight included once its deadline
 * passed (" and has not answered a ping of X ms ago" before); "" when none.
 * Returns the length written. */
static int ping_evidence(const member *m, uint64_t now, char *out, size_t len) {
    uint32_t d = deadline_ms(m);
    int flying = m->p.sent_ms && m->p.suspected;
    uint64_t age = flying ? now - m->p.sent_ms : 0;
    uint32_t n = m->p.missed_n + (flying && age >= d && m->p.missed_ms != m->p.sent_ms);
    int k = 0;
    if (n)
        k = snprintf(out, len, " and answered no ping within %u ms (%u in this silence)", d, n);
    else if (flying)
        k = snprintf(out, len, " and has not answered a ping of %u ms ago", (unsigned)age);
    else
        out[0] = '\0';
    return k < 0 ? 0 : k;
}

int rdzv__probe_kept(member *m, uint64_t now, char *evidence, size_t len) {
    evidence[0] = '\0';
    uint64_t silent = now - m->c->last_rx_ms, hb = m->rm.r ? m->rm.r->hb_timeout_ms : 0;
    if (m->p.peer_kept_ms && silent <= (uint64_t)RDZV_PEER_KEEP_FACTOR * hb &&
        now - m->p.peer_kept_ms <= hb)
        return 1;
    int flying = m->p.sent_ms && m->p.suspected;
    if (flying && m->p.relayed && m->p.relayed != UINT32_MAX && relay_heard(m) < m->p.relayed &&
        now < m->p.relay_at_ms + m->p.relay_wait_ms)
        return 1; /* the peers' word first (bounded by their deadline) */
    if (m->p.peer_kept_ms) {
        snprintf(evidence, len,
                 "; its peers' UDP probes last reached it %.1f s ago, and the rendezvous has not "
                 "heard from it for %u x the timeout",
                 (double)(now - m->p.peer_kept_ms) / 1000.0, (unsigned)RDZV_PEER_KEEP_FACTOR);
        return 0;
    }
    /* judged by the timeout, whatever suspicion it was pinged on (one in
     * flight, or ones found moot: the job did not wait for it alone): its
     * unanswered pings and the peers asked, whose bound just passed or
     * passed before the timeout, are the evidence */
    size_t k = (size_t)ping_evidence(m, now, evidence, len);
    if (k >= len)
        return 0;
    if (m->p.unreached[0])
        snprintf(evidence + k, len - k, "; nor did it answer the UDP probes of %s", m->p.unreached);
    else if (flying && m->p.relayed && m->p.relayed != UINT32_MAX)
        snprintf(evidence + k, len - k,
                 "; nor did it answer the UDP probes of %u peer node(s) (%s) within %u ms",
                 m->p.relayed, m->p.relay_names, m->p.relay_ms);
    return 0;
}

/* m, suspected, answered: by itself (by == NULL) or to a peer's probe. */
static void cleared(member *m, uint64_t now, uint32_t rtt, const member *by) {
    m->p.cleared_ms = now;
    m->p.peer_kept_ms = by ? now : 0; /* its own answer: its link to the rendezvous works */
    m->p.unreached[0] = '\0';
    m->c->s->m.probes_answered++;
    if (m->p.said_ms == 0 || now - m->p.said_ms >= RDZV_PROBE_SAY_MS) {
        m->p.said_ms = now;
        if (by)
            GB_INFO("job %s: node %s (node rank %u), suspected (%s), answered node %s's probe "
                    "in %u ms but not the rendezvous's: the link between the rendezvous and it "
                    "is slow or lossy, the node is not lost (said once a minute)",
                    m->rm.r ? m->rm.r->run_id : "?", m->rm.hostname, m->rm.node_rank,
                    m->p.suspected == RDZV_SUSPECT_WAITED ? "its peers waited for it" : "silent",
                    by->rm.hostname, rtt);
        else
            GB_INFO("job %s: node %s (node rank %u), suspected (%s), answered a probe in %u "
                    "ms: slow, not lost (said once a minute)",
                    m->rm.r ? m->rm.r->run_id : "?", m->rm.hostname, m->rm.node_rank,
                    m->p.suspected == RDZV_SUSPECT_WAITED ? "its peers waited for it" : "silent",
                    rtt);
    }
    m->p.suspected = 0;
    unlist(m);
}

void rdzv__probe_pong(conn *c, const rdzv_msg *msg) {
    member *m = c->m;
    if (m == NULL || m->p.sent_ms == 0 || msg->req_id != m->p.id)
        return; /* an answer to a probe given up on (or no member): nothing to learn */
    uint64_t now = gb_now_ms();
    uint32_t rtt = (uint32_t)(now - m->p.sent_ms);
    uint32_t decayed = m->p.rtt_ms - m->p.rtt_ms / 8;
    m->p.rtt_ms = rtt > decayed ? rtt : decayed;
    if (m->p.rtt_ms == 0)
        m->p.rtt_ms = 1; /* known: under a millisecond */
    if (m->p.suspected)
        cleared(m, now, rtt, NULL);
    else
        unlist(m);
}

static void check_ack(conn *c, const rdzv_msg *msg);

void rdzv__probe_ack(conn *c, const rdzv_msg *msg) {
    if (c->m == NULL)
        return;
    member *m;
    LIST_FOREACH(m, &c->s->probing, plink) {
        if (m->p.id == msg->req_id && m->p.relayed)
            break;
    }
    if (m == NULL) {
        check_ack(c, msg); /* a machine check's, or the suspect answered, went or was judged */
        return;
    }
    switch (msg->u.probe_ack.ok) {
    case RDZV_PROBE_OK_NODE:
        c->s->m.relays_reached++;
        cleared(m, gb_now_ms(), msg->u.probe_ack.rtt_ms, c->m);
        return;
    case RDZV_PROBE_OK_MACHINE: /* only asked with RDZV_PROBE_KERNEL (an early probe) */
        c->s->m.relays_machine++;
        m->p.relay_machine++;
        c->m->p.reaches = 1;
        return;
    case RDZV_PROBE_OK_NONE:
        c->s->m.relays_unreached++;
        m->p.relay_nacks++;
        if (m->p.checker && c->m->p.serial == m->p.checker)
            m->p.checker_nack = 1;
        return;
    default: /* RDZV_PROBE_OK_UNABLE, or a code this server does not know: no word */
        c->s->m.relays_unable++;
        m->p.relay_unable++;
    }
}

/* ---- machine checks (kernel probes, rule 8) ---- */

/* Whether x, a peer of m's round, can check m's kernel-probe port. */
static int can_check(const member *x, const member *m) { return x != m && kernel_peer(x); }

/* A peer to check m's kernel-probe port: on another host than m where there
 * is one; among those, one whose reach is not known yet first (so that every
 * node soon shows it), then one that reached a port, and last one that
 * reached none and said of one that it did not (it may not connect out);
 * starting at a place that moves with the check so that one node is not
 * everyone's checker. */
static member *checker(const member *m, uint32_t id) {
    static const int order[3] = {0, 1, -1}; /* by reaches */
    const rdzv_round *r = m->rm.r;
    for (int pass = 0; pass < 6; pass++) {
        int other_host = pass < 3, reaches = order[pass % 3];
        for (uint32_t k = 0; k < r->nranks; k++) {
            rdzv_rmember *rm = r->ranks[(k + id) % r->nranks];
            if (rm == NULL)
                continue;
            member *x = member_of(rm);
            if (can_check(x, m) && x->p.reaches == reaches &&
                (strcmp(x->rm.hostname, m->rm.hostname) != 0) == other_host)
                return x;
        }
    }
    return NULL;
}

/* Whether m's round has a peer on another host than m's that can check it. */
static int other_host_in(const member *m) {
    const rdzv_round *r = m->rm.r;
    for (uint32_t i = 0; i < r->nranks; i++) {
        rdzv_rmember *rm = r->ranks[i];
        if (rm && can_check(member_of(rm), m) && strcmp(rm->hostname, m->rm.hostname) != 0)
            return 1;
    }
    return 0;
}

void rdzv__probe_machine(member *m, uint64_t now) {
    rdzv_server *s = m->c->s;
    if (s->o.probes != RDZV_PROBES_ON || !m->p.kernel || m->rm.r == NULL)
        return;
    if (m->p.check_id) {
        if (now - m->p.check_sent_ms < (uint64_t)RDZV_CHECK_MS + RDZV_RELAY_GRACE_MS)
            return;
        s->m.checks_no_answer++; /* its checker went, or its word was lost: another one */
        m->p.check_id = 0;
        m->p.check_at_ms = now + RDZV_CHECK_RETRY_MS;
        return;
    }
    const member *ck = m->p.machine == 1 ? by_serial(m->rm.r, m->p.checker) : NULL;
    if (m->p.machine == 1 && (ck == NULL || ck->rm.done || !ck->rm.active) &&
        m->p.check_at_ms > now + RDZV_CHECK_RETRY_MS)
        m->p.check_at_ms = now; /* its checker left: no early probe of it without another */
    if (now < m->p.check_at_ms || (m->p.sent_ms && m->p.suspected))
        return; /* not due, or silent now: a suspicion's probes are about it */
    if (++s->probe_id == 0)
        s->probe_id = 1;
    member *x = checker(m, s->probe_id);
    if (x == NULL) {
        m->p.check_at_ms = now + RDZV_CHECK_RETRY_MS; /* alone in its round: nobody to check */
        return;
    }
    rdzv_msg q = {.type = RDZV_PROBE_REQ, .flags = RDZV_PROBE_MACHINE, .req_id = s->probe_id};
    snprintf(q.u.probe_req.addr, sizeof q.u.probe_req.addr, "%s", m->p.peer_ip);
    q.u.probe_req.port = m->p.peer_port;
    q.u.probe_req.deadline_ms = RDZV_CHECK_MS;
    rdzv__send_msg(x->c, &q);
    m->p.check_id = s->probe_id;
    m->p.check_sent_ms = now;
    GB_DEBUG("job %s: %s checks that %s's TCP port %u is reached", m->rm.r->run_id, x->rm.hostname,
             m->rm.hostname, (unsigned)m->p.peer_port);
}

static void check_ack(conn *c, const rdzv_msg *msg) {
    rdzv_round *r = c->m->rm.r;
    member *m = NULL;
    for (uint32_t i = 0; r && i < r->nranks && m == NULL; i++)
        if (r->ranks[i] && member_of(r->ranks[i])->p.check_id == msg->req_id)
            m = member_of(r->ranks[i]);
    if (m == NULL)
        return; /* not a check in flight: the probe it answers was settled */
    rdzv_server *s = c->s;
    uint64_t now = gb_now_ms();
    m->p.check_id = 0;
    switch (msg->u.probe_ack.ok) {
    case RDZV_PROBE_OK_NODE:
    case RDZV_PROBE_OK_MACHINE:
        s->m.checks_reached++;
        m->p.machine = 1;
        m->p.checker = c->m->p.serial;
        m->p.check_nos = 0;
        c->m->p.reaches = 1;
        /* checked again later: the path may close; sooner when only its own
         * host reached it and another host's peer may try now */
        m->p.check_at_ms = now + (strcmp(c->m->rm.hostname, m->rm.hostname) == 0 && other_host_in(m)
                                      ? RDZV_CHECK_RETRY_MS
                                      : RDZV_CHECK_PASSED_MS);
        if (m->p.check_said)
            GB_WARN("job %s: node %s's TCP port %u is reached from node %s now: kernel probes "
                    "of it are on again",
                    r->run_id, m->rm.hostname, (unsigned)m->p.peer_port, c->m->rm.hostname);
        m->p.check_said = 0;
        return;
    case RDZV_PROBE_OK_NONE:
        break;
    default: /* RDZV_PROBE_OK_UNABLE, or a code this server does not know: no word */
        s->m.checks_unable++;
        m->p.check_at_ms = now + RDZV_CHECK_RETRY_MS;
        return;
    }
    s->m.checks_unreached++;
    if (c->m->p.reaches != 1) { /* a peer not known to connect out: its word alone is not enough */
        c->m->p.reaches = -1;
        if (++m->p.check_nos < RDZV_CHECK_NOS) {
            m->p.check_at_ms = now; /* another peer's word, at once */
            return;
        }
    }
    m->p.machine = -1;
    m->p.check_at_ms = now + RDZV_CHECK_AGAIN_MS;
    if (!m->p.check_said)
        GB_WARN("job %s: node %s's TCP port %u (the number of its UDP peer port) was not "
                "reached from node %s within %.1f s: kernel probes of it are off, so a "
                "vanished %s is found about a second later, by the UDP probes and the "
                "heartbeat rules; let TCP to that port through between the job's nodes (a "
                "firewall, a security group, a NetworkPolicy), or run gpulaunch-rdzv with "
                "--probes udp to say that it cannot be (checked again every %d s)",
                r->run_id, m->rm.hostname, (unsigned)m->p.peer_port, c->m->rm.hostname,
                RDZV_CHECK_MS / 1000.0, m->rm.hostname, RDZV_CHECK_AGAIN_MS / 1000);
    m->p.check_said = 1;
}

/* Asks peers of m's round to probe it: xs (n of them) for an early probe
 * (kernel probes too), else up to RDZV_PROBE_RELAYS that pick_relays
 * chooses from a place that moves with the probe. */
static void relay(member *m, uint64_t now, member *const *xs, uint32_t n) {
    rdzv_round *r = m->rm.r;
    uint64_t age = now - m->p.sent_ms;
    uint32_t d = deadline_ms(m);
    uint32_t left = age < d ? (uint32_t)(d - age) : 0;
    member *pick[RDZV_PROBE_RELAYS];
    int kernel = xs != NULL; /* its machine too, by peers that reach such ports */
    if (!kernel) {
        n = pick_relays(m, m->p.id, 0, pick);
        xs = pick;
    }
    uint32_t prtt = 0; /* the slowest asked peer's worst round trip (unknown: a probe's most) */
    for (uint32_t i = 0; i < n; i++) {
        uint32_t x = xs[i]->p.rtt_ms ? xs[i]->p.rtt_ms : RDZV_PROBE_MAX_MS;
        prtt = x > prtt ? x : prtt;
    }
    /* long enough for a launcher's stall and the peers' round trips: a node
     * stopped just as they were asked must still answer in it */
    uint64_t need = RDZV_SILENCE_STALL_MS + (uint64_t)RDZV_PROBE_RTT_FACTOR * prtt;
    if (need > RDZV_TIMEOUT_RELAY_MAX_MS)
        need = RDZV_TIMEOUT_RELAY_MAX_MS;
    if (m->p.suspected == RDZV_SUSPECT_TIMEOUT) {
        /* until the timeout less the grace, and that long (a node kept past
         * the timeout is asked again with the whole window) */
        uint64_t silent = now - m->c->last_rx_ms, hb = r->hb_timeout_ms;
        uint64_t to = silent + RDZV_RELAY_GRACE_MS < hb ? hb - silent - RDZV_RELAY_GRACE_MS : 0;
        if (to < RDZV_TIMEOUT_RELAY_MIN_MS)
            to = RDZV_TIMEOUT_RELAY_MIN_MS;
        if (to < need)
            to = need;
        left = to > RDZV_TIMEOUT_RELAY_MAX_MS ? RDZV_TIMEOUT_RELAY_MAX_MS : (uint32_t)to;
    } else if (m->p.suspected == RDZV_SUSPECT_SILENT) {
        /* silence alone, no collective pointing at it: its link may have held
         * its frames (a loss waiting out a long retransmission timeout) while
         * its launcher stops as they are asked; their answer is the evidence */
        left = need > left ? (uint32_t)need : left;
    } else if (kernel) {
        uint32_t e = early_ms(m, xs, n); /* the peers' own round trips count too */
        left = e > left ? e : left;
    }
    m->p.relay_ms = left > RDZV_RELAY_MIN_MS ? left : RDZV_RELAY_MIN_MS;
    m->p.relay_wait_ms = m->p.relay_ms + prtt + RDZV_RELAY_GRACE_MS;
    m->p.relay_at_ms = now;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        member *x = xs[i];
        rdzv_msg q = {
            .type = RDZV_PROBE_REQ, .flags = kernel ? RDZV_PROBE_KERNEL : 0, .req_id = m->p.id};
        snprintf(q.u.probe_req.addr, sizeof q.u.probe_req.addr, "%s", m->p.peer_ip);
        q.u.probe_req.port = m->p.peer_port;
        q.u.probe_req.deadline_ms = m->p.relay_ms;
        rdzv__send_msg(x->c, &q);
        m->c->s->m.relays_sent++;
        if (off < sizeof m->p.relay_names) {
            int k = snprintf(m->p.relay_names + off, sizeof m->p.relay_names - off, "%s%s",
                             off ? ", " : "", x->rm.hostname);
            off += k > 0 ? (size_t)k : 0;
        }
    }
    m->p.relayed = n ? n : UINT32_MAX; /* asked once per probe; UINT32_MAX: nobody to ask */
    if (n)
        GB_DEBUG("%s answers no probe %u ms in: %u peer node(s) probe it (%s)", m->rm.hostname,
                 (unsigned)age, n, m->p.relay_names);
}

void rdzv__probe_gone(member *m) { unlist(m); }

/* Who waits for m, for the verdict: how many of its round's other nodes, the
 * first few by name and the longest wait. */
static void evidence(const member *m, uint64_t now, char *out, size_t len) {
    const rdzv_round *r = m->rm.r;
    uint32_t waiting = 0, others = 0;
    uint64_t longest = 0;
    char names[96] = "";
    size_t off = 0;
    for (uint32_t i = 0; i < r->nranks; i++) {
        const rdzv_rmember *rm = r->ranks[i];
        if (rm == NULL || rm == &m->rm || rm->done)
            continue;
        others++;
        const member *x = member_of((rdzv_rmember *)rm);
        if (x->p.wait_from_ms == 0)
            continue;
        if (now - x->p.wait_from_ms > longest)
            longest = now - x->p.wait_from_ms;
        if (waiting++ < 3 && off < sizeof names) {
            int n =
                snprintf(names + off, sizeof names - off, "%s%s", off ? ", " : "", rm->hostname);
            off += n > 0 ? (size_t)n : 0;
        }
    }
    snprintf(out, len,
             "answered no ping within %u ms while %u of its %u peer node(s) waited for it inside a "
             "collective (%s%s; the longest %.2f s); its last heartbeat came %.2f s ago",
             deadline_ms(m), waiting, others, names, waiting > 3 ? ", ..." : "",
             (double)longest / 1000.0, (double)(now - m->c->last_rx_ms) / 1000.0);
}

/* Whether the round is blocked on m now: 1 when every other node of it
 * waits in a collective or is a suspect that did not answer its probe in
 * time either; 0 when a node neither waits nor is suspected (a straggler
 * that answered and computes still: it can finish the collective, m is not
 * what the job waits for, and a node whose launcher alone stopped, its
 * workers in the collective, is not lost); -1 when that turns on a suspect
 * whose probe's deadline has not passed yet: its answer first (a straggler
 * pinged again a moment before m's deadline passed is not taken for lost). */
static int blocked_on(const member *m, uint64_t now) {
    const rdzv_round *r = m->rm.r;
    int pending = 0;
    for (uint32_t i = 0; i < r->nranks; i++) {
        const rdzv_rmember *rm = r->ranks[i];
        if (rm == NULL || rm == &m->rm || rm->done)
            continue;
        const member *x = member_of((rdzv_rmember *)rm);
        if (x->p.wait_from_ms)
            continue;
        if (!(x->p.sent_ms && x->p.suspected))
            return 0;
        if (now - x->p.sent_ms < deadline_ms(x))
            pending = 1;
    }
    return pending ? -1 : 1;
}

void rdzv__probe_sweep(rdzv_server *s, uint64_t now) {
    member *m, *next;
again:
    for (m = LIST_FIRST(&s->probing); m; m = next) {
        next = LIST_NEXT(m, plink);
        int running = m->rm.r && m->rm.active && !m->rm.done && m->rm.r->state == RDZV_R_RUNNING;
        if (m->p.suspected && !running) {
            unlist(m); /* its round ended meanwhile: the suspicion is moot */
            continue;
        }
        if (m->p.suspected && m->c->last_rx_ms > m->p.sent_ms) {
            /* it spoke since the ping (its PONG may be behind on a slow link): alive */
            cleared(m, now, (uint32_t)(m->c->last_rx_ms - m->p.sent_ms), NULL);
            continue;
        }
        uint32_t d = deadline_ms(m);
        uint64_t age = now - m->p.sent_ms;
        if (m->p.suspected && !m->p.relayed && age >= d / 3 && m->p.peer_port)
            relay(m, now, NULL, 0);
        if (age < (m->p.suspected ? d : RDZV_PROBE_MAX_MS))
            continue;
        if (m->p.suspected && m->p.missed_ms != m->p.sent_ms) {
            m->p.missed_ms = m->p.sent_ms; /* unanswered: evidence if the timeout judges it */
            m->p.missed_n++;
        }
        if (m->p.suspected && m->p.relayed && m->p.relayed != UINT32_MAX &&
            relay_heard(m) < m->p.relayed &&
            (age < (uint64_t)d + RDZV_RELAY_GRACE_MS ||
             now < m->p.relay_at_ms + m->p.relay_wait_ms))
            continue;          /* the peers' word first */
        if (!m->p.suspected) { /* a calibration unanswered: learnt at the next one */
            unlist(m);
            continue;
        }
        if (m->p.suspected == RDZV_SUSPECT_TIMEOUT) {
            /* judged by the heartbeat timeout, not here: what the peers found is kept for it */
            if (m->p.relayed && m->p.relayed != UINT32_MAX && relay_heard(m) < m->p.relayed &&
                now < m->p.relay_at_ms + m->p.relay_wait_ms)
                continue;
            if (m->p.relayed && m->p.relayed != UINT32_MAX)
                snprintf(m->p.unreached, sizeof m->p.unreached, "%u peer node(s) (%s) within %u ms",
                         m->p.relayed, m->p.relay_names, m->p.relay_ms);
            m->p.peer_kept_ms = 0; /* asked again, and not reached: no longer kept */
            s->m.probes_unanswered++;
            m->p.suspected = 0;
            unlist(m);
            continue;
        }
        if (m->p.suspected == RDZV_SUSPECT_EARLY &&
            (m->p.relay_machine || m->p.relay_nacks < RDZV_EARLY_NACKS || !m->p.checker_nack)) {
            /* its machine lives (a stopped or starved launcher), or too few peers could
             * say, or not the one that reached it before: the rules of a launcher's
             * silence judge it, a second later */
            GB_DEBUG("%s answered no early probe, but %s: left to the silence rules",
                     m->rm.hostname,
                     m->p.relay_machine ? "its machine accepted a peer's connection"
                     : m->p.relay_nacks < RDZV_EARLY_NACKS
                         ? "too few peers could say whether its machine lives"
                         : "the peer that reached its machine before did not say it no longer "
                           "does");
            unlist(m);
            continue;
        }
        int blocked = m->p.suspected == RDZV_SUSPECT_WAITED ? blocked_on(m, now) : 1;
        if (blocked < 0)
            continue; /* another suspect's answer first: its deadline comes within 2 s */
        if (!blocked) {
            /* moot: a wait said again suspects it again */
            GB_DEBUG("%s answered no probe, but the job does not wait for it alone",
                     m->rm.hostname);
            unlist(m);
            continue;
        }
        char ev[RDZV_MAX_MSG / 2];
        if (m->p.suspected == RDZV_SUSPECT_WAITED)
            evidence(m, now, ev, sizeof ev);
        else if (m->p.suspected == RDZV_SUSPECT_EARLY)
            snprintf(ev, sizeof ev,
                     "sent nothing for %.2f s (its worst recent gap %.2f s) and answered no ping "
                     "within %u ms; %u of the %u peer node(s) asked (%s) reached neither it nor "
                     "its machine within %u ms (UDP and TCP probes)",
                     (double)(now - m->c->last_rx_ms) / 1000.0, (double)m->p.gap_ms / 1000.0, d,
                     m->p.relay_nacks, m->p.relayed, m->p.relay_names, m->p.relay_ms);
        else
            snprintf(ev, sizeof ev,
                     "sent nothing for %.2f s (its worst recent gap %.2f s, the heartbeat timeout "
                     "%.1f s) and answered no ping within %u ms",
                     (double)(now - m->c->last_rx_ms) / 1000.0, (double)m->p.gap_ms / 1000.0,
                     (double)m->rm.r->hb_timeout_ms / 1000.0, d);
        if (m->p.relayed && m->p.relayed != UINT32_MAX && m->p.suspected != RDZV_SUSPECT_EARLY) {
            size_t n = strlen(ev);
            snprintf(ev + n, sizeof ev - n,
                     "; nor did it answer the UDP probes of %u peer node(s) (%s) within %u ms",
                     m->p.relayed, m->p.relay_names, m->p.relay_ms);
        }
        s->m.probes_unanswered++;
        m->p.suspected = 0;
        unlist(m);
        rdzv__job_unresponsive(m, ev, now);
        goto again; /* the round's end may have changed the list */
    }
}
