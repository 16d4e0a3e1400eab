/*
 * gsrun-hook: the Slurm hook's client of the node agent (wrapper/agent.py: gsrun.wrapper.agent).
 *
 *     gsrun-hook SOCKET PROGRAM [ARG...]
 *
 * Hands PROGRAM's command line, this process's environment, umask and
 * stdin/stdout/stderr to the agent listening on SOCKET, which runs the hook
 * in a child forked from a process that has already imported it, and exits
 * with that child's status (or dies of the same signal). Whenever the agent
 * is not there, refuses ("F"), or does not answer at once, it execs PROGRAM
 * itself: the hook then runs exactly as without the agent. The handshake
 * (agent "R", client "G", the hook's own process "S"; gsrun/wrapper/agent.py)
 * makes the hook run once whatever fails where.
 *
 * Only the standard C library; no allocation larger than the request. The
 * protocol's client side is agent_client.h (shared with the SPANK plugin).
 * Built by `gsrun-node agent build` (wrapper/hook_client.py).
 */
#define _GNU_SOURCE
#include <errno.h>
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

#include "agent_client.h"

extern char **environ;

static void run_it_yourself(char **argv) __attribute__((noreturn));
static void run_it_yourself(char **argv)
{
	execv(argv[0], argv);
	fprintf(stderr, "gsrun: hook: cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

int main(int argc, char **argv)
{
	struct timeval tv = { 0 };
	struct gs_msg m = { 0 };
	char reply, st[4];
	mode_t um;
	int fd, i, status;

	if (argc < 3) {
		fprintf(stderr, "usage: gsrun-hook SOCKET /PATH/PROGRAM [ARG...]\n");
		return 2;
	}
	if (argv[2][0] != '/') {
		/* the agent serves only absolute commands: this one runs itself, as the hook line says */
		execvp(argv[2], argv + 2);
		fprintf(stderr, "gsrun: hook: cannot run %s: %s\n", argv[2], strerror(errno));
		_exit(127);
	}
	/* bounded until the agent says it started the hook; only an agent of our own user
	 * gets the environment and the descriptors, and is believed about the hook's status */
	fd = gs_agent_connect(argv[1], 2);
	if (fd < 0)
		run_it_yourself(argv + 2);
	um = umask(0);
	umask(um);
	if (gs_msg_begin(&m, um, argc - 2))
		goto fallback;
	for (i = 2; i < argc; i++)
		if (gs_msg_add(&m, argv[i]))
			goto fallback;
	for (char **e = environ; e && *e; e++)
		if (gs_msg_add(&m, *e))
			goto fallback;
	if (gs_msg_send(fd, &m, 1))
		goto fallback;      /* two of 0-2 closed (EBADF) too: the hook runs itself */
	gs_msg_free(&m);
	if (gs_read_full(fd, &reply, 1) || reply != 'R')
		goto fallback;              /* "F", a timeout or a closed socket: nothing ran */
	/* "go": from here the agent may start the hook; it starts nothing without it */
	reply = 'G';
	if (send(fd, &reply, 1, MSG_NOSIGNAL) != 1)
		goto fallback;
	/* no timeout from here: the agent forks at once, and slurmd's PrologEpilogTimeout bounds the rest */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* "S" comes from the hook's own process before it does anything: a connection
	 * closed without it means nothing ran */
	if (gs_read_full(fd, &reply, 1) || reply != 'S')
		goto fallback;
	if (gs_read_full(fd, &reply, 1) || reply != 'X' || gs_read_full(fd, st, 4)) {
		/* the agent died under a running hook: its status is lost. A failed
		 * prolog drains the node, so, as for any bug of gsrun's, exit 0 */
		fprintf(stderr, "gsrun: hook: the node agent went away while %s ran; its exit status "
			"is unknown\nhint: see the agent's log (journalctl -u gsrun-agent)\n", argv[2]);
		return 0;
	}
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

fallback:
	gs_msg_free(&m);
	close(fd);
	run_it_yourself(argv + 2);
}
