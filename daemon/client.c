/*
 * gsrun-hook: the Slurm hooks' client of the node daemon (daemon/server.py: gsrun.daemon.server).
 *
 *     gsrun-hook SOCKET PROGRAM [ARG...]
 *
 * Hands PROGRAM's command line (a hook of this installation), this process's
 * environment (of the job's SPANK_ variables only those the hooks read: forwarded()), umask and stdin/stdout/stderr to the daemon listening on
 * SOCKET, which runs the hook in a child it forks, and exits with that child's
 * status (or dies of the same signal). The daemon is the one way a hook runs:
 * when it is not there, or refuses, the client says why on stderr
 * ("gsrun: prolog: node daemon not running: ..." and a hint) and exits 1, so
 * slurmd drains the node as it does when munged is down. While the daemon
 * re-executes after an upgrade ("F", or no socket for a moment) the client
 * tries again for GS_RETRY_S seconds. The handshake (daemon "R", client "G",
 * the hook's own process "S") makes the hook run at most once.
 *
 * Only the standard C library; no allocation larger than the request. The
 * protocol's client side is client.h (shared with the SPANK plugin).
 * Built by `gsrun-node daemon build` (daemon/build.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client.h"

#define GS_RETRY_S 5 /* seconds a hook waits for a daemon that is (re)starting */

extern char **environ;

/* The hook's name for messages: the first of prolog, epilog, epilog-ctld among the arguments. */
static const char *hook_name(int argc, char **argv)
{
	for (int i = 3; i < argc; i++)
		if (!strcmp(argv[i], "prolog") || !strcmp(argv[i], "epilog") || !strcmp(argv[i], "epilog-ctld"))
			return argv[i];
	return "hook";
}

/* The job's SPANK job-control environment (SPANK_<NAME>, from sbatch/srun/salloc) is the one part
 * of a hook's environment that a user sets freely, in size and in number of names (a SPANK plugin
 * of their own, any client of the submit RPC): the daemon is handed only the SPANK_ variables the
 * hooks read (gsrun.facts.jobenv.SPANK_KEYS; a test keeps the two equal), each cut to
 * GS_SPANK_ENTRY_MAX bytes -- still a value the hooks refuse (they take at most 512 characters) --
 * so a job's environment can neither push the request over its limit (the hook failing, slurmd
 * draining the node) nor reach root's hooks in bulk. */
static const char *const gs_spank_keys[] = { "SPANK_GS_MPS", "SPANK_GS_MIG", "SPANK_GS_TUNE", "SPANK_GS_BIND",
					      "SPANK_GS_REPORT", "SPANK_GS_EXCLUSIVE" };
#define GS_SPANK_ENTRY_MAX 1024

/* The entry to hand over for the environment entry e: e itself, a bounded copy in buf
 * (GS_SPANK_ENTRY_MAX + 1 bytes), or NULL to leave it out. */
static const char *forwarded(const char *e, char *buf)
{
	size_t n = strcspn(e, "=");

	if (strncmp(e, "SPANK_", 6) != 0)
		return e;
	for (size_t i = 0; i < sizeof(gs_spank_keys) / sizeof(gs_spank_keys[0]); i++)
		if (strlen(gs_spank_keys[i]) == n && strncmp(e, gs_spank_keys[i], n) == 0) {
			if (strlen(e) <= GS_SPANK_ENTRY_MAX)
				return e;
			memcpy(buf, e, GS_SPANK_ENTRY_MAX);
			buf[GS_SPANK_ENTRY_MAX] = '\0';
			return buf;
		}
	return NULL;
}

static int fail(const char *hook, const char *what, const char *why, const char *hint)
{
	fprintf(stderr, "gsrun: %s: %s: %s\nhint: %s\n", hook, what, why, hint);
	return 1;
}

#define HINT_START "start it: systemctl start gsrun-daemon (journalctl -u gsrun-daemon says why it " \
		   "stopped); the node stays drained until it runs"

int main(int argc, char **argv)
{
	struct timeval tv = { 0 };
	struct gs_msg m = { 0 };
	char reply, st[4], why[512], spank_buf[GS_SPANK_ENTRY_MAX + 1];
	const char *fwd;
	const char *hook;
	mode_t um;
	int fd = -1, i, status, tries, other_user = 0;

	if (argc < 3) {
		fprintf(stderr, "usage: gsrun-hook SOCKET /PATH/PROGRAM [ARG...]\n");
		return 2;
	}
	hook = hook_name(argc, argv);
	/* slurmd or slurmctld may start a hook with one of 0-2 closed: it reaches the hook as
	 * /dev/null (the daemon is handed 0-2), and the socket never takes its number */
	for (i = 0; i < 3; i++)
		if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) != i)
			return fail(hook, "node daemon client", "descriptors 0-2 closed and /dev/null cannot be opened",
				    "see the node's /dev");
	um = umask(0);
	umask(um);
	if (gs_msg_begin(&m, um, argc - 2))
		return fail(hook, "node daemon client", "out of memory", "see the node's memory");
	for (i = 2; i < argc; i++)
		if (gs_msg_add(&m, argv[i]))
			return fail(hook, "node daemon client", "command line over 1 MiB", "shorten the hook's line");
	for (char **e = environ; e && *e; e++)
		if ((fwd = forwarded(*e, spank_buf)) != NULL && gs_msg_add(&m, fwd))
			return fail(hook, "node daemon client", "environment over 1 MiB",
				    "the hook's environment comes from slurmd: see slurm.conf's Prolog/Epilog lines");
	/* bounded until the daemon says it started the hook; only a daemon of our own user (or root's)
	 * gets the environment and the descriptors, and is believed about the hook's status */
	for (tries = 0; ; tries++) {
		if (tries)
			usleep(100000);
		if (tries >= GS_RETRY_S * 10) {
			gs_msg_free(&m);
			snprintf(why, sizeof(why), "%s: %s", argv[1],
				 other_user ? "served by another user" :
				 fd == -2 ? "busy re-executing" : strerror(errno));
			return fail(hook, "node daemon not running", why, HINT_START);
		}
		fd = gs_daemon_connect(argv[1], 2);
		if (fd < 0) {
			other_user |= errno == EPERM;
			continue;
		}
		if (gs_msg_send(fd, &m, 1)) {
			close(fd);
			gs_msg_free(&m);
			return fail(hook, "node daemon client", "cannot send the request (are stdin, stdout and stderr open?)",
				    "slurmd starts hooks with them open; run the hook from slurmd");
		}
		if (gs_read_full(fd, &reply, 1)) {
			close(fd);
			continue;       /* closed or timed out: nothing ran */
		}
		if (reply == 'F') {
			close(fd);
			fd = -2;        /* re-executing after an upgrade */
			errno = EAGAIN;
			continue;
		}
		break;
	}
	gs_msg_free(&m);
	if (reply == 'E') {
		ssize_t n = read(fd, why, sizeof(why) - 1);

		why[n > 0 ? n : 0] = 0;
		why[strcspn(why, "\n")] = 0;
		close(fd);
		return fail(hook, "node daemon refused the hook", why[0] ? why : "no reason given",
			    "point slurm.conf's Prolog/Epilog at the lines `gsrun-node install` prints");
	}
	if (reply != 'R') {
		close(fd);
		return fail(hook, "node daemon client", "unexpected answer", "client and daemon of different releases: "
			    "rebuild the client with `gsrun-node daemon build` and restart gsrun-daemon");
	}
	/* "go, and K after X": from here the daemon may start the hook; it starts nothing without it */
	reply = 'H';
	if (send(fd, &reply, 1, MSG_NOSIGNAL) != 1)
		return fail(hook, "node daemon not running", "it closed the connection before the hook started", HINT_START);
	/* no timeout from here: the daemon forks at once, and slurmd's PrologEpilogTimeout bounds the rest */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* "S" comes from the hook's own process before it does anything: a connection
	 * closed without it means nothing ran */
	if (gs_read_full(fd, &reply, 1) || reply != 'S')
		return fail(hook, "node daemon not running", "it went away before the hook started", HINT_START);
	if (gs_read_full(fd, &reply, 1) || reply != 'X' || gs_read_full(fd, st, 4)) {
		/* the hook's process and the daemon both ended without an X: its status is
		 * lost. A failed prolog drains the node, so, as for any bug of gsrun's, exit 0 */
		fprintf(stderr, "gsrun: %s: the hook and the node daemon went away without its exit status"
			"\nhint: see the daemon's log (journalctl -u gsrun-daemon)\n", hook);
		return 0;
	}
	/* "kept": the status is ours, the rest of the hook (an epilog's report) is the daemon's */
	reply = 'K';
	(void)send(fd, &reply, 1, MSG_NOSIGNAL);
	status = (int)(((uint32_t)(unsigned char)st[0] << 24) | ((uint32_t)(unsigned char)st[1] << 16) |
		       ((uint32_t)(unsigned char)st[2] << 8) | (uint32_t)(unsigned char)st[3]);
	if (WIFSIGNALED(status)) {
		sigset_t one;

		/* die of the same signal, as slurmd would have seen the hook die: at its default
		 * action and not blocked (a mask inherited from slurmd would hold it) */
		signal(WTERMSIG(status), SIG_DFL);
		sigemptyset(&one);
		sigaddset(&one, WTERMSIG(status));
		sigprocmask(SIG_UNBLOCK, &one, NULL);
		raise(WTERMSIG(status));
		return 128 + WTERMSIG(status);
	}
	return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
