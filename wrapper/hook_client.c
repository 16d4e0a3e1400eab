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
 * Only the standard C library; no allocation larger than the request.
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define MAX_REQUEST (1u << 20) /* gsrun.wrapper.agent.MAX_REQUEST_BYTES */

static void run_it_yourself(char **argv) __attribute__((noreturn));
static void run_it_yourself(char **argv)
{
	execv(argv[0], argv);
	fprintf(stderr, "gsrun: hook: cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

static int add(char *buf, size_t *len, const char *s)
{
	size_t n = strlen(s) + 1;

	if (*len + n > MAX_REQUEST - 4)
		return -1;
	memcpy(buf + 4 + *len, s, n);
	*len += n;
	return 0;
}

static int read_full(int fd, char *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = 2 };
	char ctl[CMSG_SPACE(3 * sizeof(int))] = { 0 };
	char numbuf[32], reply, st[4];
	char *buf;
	size_t len = 0;
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
	if (strlen(argv[1]) >= sizeof(sa.sun_path))
		run_it_yourself(argv + 2);
	strcpy(sa.sun_path, argv[1]);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		run_it_yourself(argv + 2);
	/* one of 0-2 was closed and the socket took its number: it would go to the hook
	 * as its stdin/stdout/stderr. The hook runs itself, with that one closed */
	if (fd < 3)
		goto fallback;
	/* bounded until the agent says it started the hook */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fallback;
	{
		/* only an agent of our own user gets the environment and the descriptors,
		 * and is believed about the hook's status */
		struct ucred cr;
		socklen_t crl = sizeof(cr);

		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 || crl != sizeof(cr) ||
		    cr.uid != geteuid())
			goto fallback;
	}

	buf = malloc(MAX_REQUEST);
	if (!buf)
		goto fallback;
	um = umask(0);
	umask(um);
	snprintf(numbuf, sizeof(numbuf), "%o", (unsigned)um);
	if (add(buf, &len, "GSH1") || add(buf, &len, numbuf))
		goto fallback;
	snprintf(numbuf, sizeof(numbuf), "%d", argc - 2);
	if (add(buf, &len, numbuf))
		goto fallback;
	for (i = 2; i < argc; i++)
		if (add(buf, &len, argv[i]))
			goto fallback;
	for (char **e = environ; e && *e; e++)
		if (add(buf, &len, *e))
			goto fallback;
	buf[0] = (char)(len >> 24);
	buf[1] = (char)(len >> 16);
	buf[2] = (char)(len >> 8);
	buf[3] = (char)len;

	{
		struct iovec iov = { .iov_base = buf, .iov_len = len + 4 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
				     .msg_control = ctl, .msg_controllen = sizeof(ctl) };
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		int fds[3] = { 0, 1, 2 };
		size_t off = 0;

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(fds));
		memcpy(CMSG_DATA(c), fds, sizeof(fds));
		while (off < len + 4) {
			ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);

			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				goto fallback;      /* two of 0-2 closed (EBADF) too: the hook runs itself */
			off += (size_t)w;
			iov.iov_base = buf + off;
			iov.iov_len = len + 4 - off;
			mh.msg_control = NULL;  /* the descriptors go with the first part only */
			mh.msg_controllen = 0;
		}
	}
	free(buf);
	if (read_full(fd, &reply, 1) || reply != 'R')
		goto fallback;              /* "F", a timeout or a closed socket: nothing ran */
	/* "go": from here the agent may start the hook; it starts nothing without it */
	reply = 'G';
	if (send(fd, &reply, 1, MSG_NOSIGNAL) != 1)
		goto fallback;
	/* no timeout from here: the agent forks at once, and slurmd's PrologEpilogTimeout bounds the rest */
	tv.tv_sec = 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* "S" comes from the hook's own process before it does anything: a connection
	 * closed without it means nothing ran */
	if (read_full(fd, &reply, 1) || reply != 'S')
		goto fallback;
	if (read_full(fd, &reply, 1) || reply != 'X' || read_full(fd, st, 4)) {
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
	close(fd);
	run_it_yourself(argv + 2);
}
