/* Allocates a dma-buf from each source named on the command line (vgem, udmabuf, system,
 * heap:<name>), fills it through its own mmap bracketed by DMA_BUF_IOCTL_SYNC, reads it back
 * through the library's synced copy, and checks the errors of bad arguments.
 *
 *   cc fill_and_check.c -I include -L target/debug -ldmabuf_alloc -o fill_and_check
 *   LD_LIBRARY_PATH=target/debug ./fill_and_check vgem udmabuf system
 */
#include <dmabuf_alloc.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int check(const char *source, uint64_t want)
{
	uint64_t size = 0, again = 0;
	int fd = dmabuf_alloc_from(source, want, &size);

	if (fd < 0) {
		fprintf(stderr, "%s: %s (errno %d)\n", source, dmabuf_alloc_error(), errno);
		return 1;
	}
	if (size < want || size % dmabuf_alloc_page_size() != 0 ||
	    dmabuf_alloc_size(fd, &again) != 0 || again != size) {
		fprintf(stderr, "%s: size %llu for %llu\n", source,
			(unsigned long long)size, (unsigned long long)want);
		return 1;
	}

	/* The CPU writes through its own mapping, inside a synced access. */
	unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	if (dmabuf_alloc_sync(fd, DMABUF_ALLOC_SYNC_START | DMABUF_ALLOC_SYNC_WRITE)) {
		fprintf(stderr, "%s: %s\n", source, dmabuf_alloc_error());
		return 1;
	}
	for (uint64_t i = 0; i < size; i++)
		p[i] = (unsigned char)(i * 7 + 1);
	dmabuf_alloc_sync(fd, DMABUF_ALLOC_SYNC_END | DMABUF_ALLOC_SYNC_WRITE);
	munmap(p, size);

	/* ... and reads back with the library's synced copy. */
	unsigned char tail[64];
	if (dmabuf_alloc_read(fd, size - sizeof(tail), tail, sizeof(tail))) {
		fprintf(stderr, "%s: %s\n", source, dmabuf_alloc_error());
		return 1;
	}
	for (size_t i = 0; i < sizeof(tail); i++) {
		if (tail[i] != (unsigned char)((size - sizeof(tail) + i) * 7 + 1)) {
			fprintf(stderr, "%s: byte %zu differs\n", source, i);
			return 1;
		}
	}
	/* A copy past the end is refused with EINVAL, not truncated. */
	if (dmabuf_alloc_write(fd, size, tail, 1) != -1 || errno != EINVAL) {
		fprintf(stderr, "%s: a write past the end was not refused\n", source);
		return 1;
	}
	close(fd);
	printf("RESULT source=%s size=%llu ok\n", source, (unsigned long long)size);
	return 0;
}

int main(int argc, char **argv)
{
	int failed = 0;
	uint64_t size;

	for (int i = 1; i < argc; i++)
		failed |= check(argv[i], 1000000); /* not a page multiple: rounded up */

	/* Bad arguments: -1, errno, and a message. */
	if (dmabuf_alloc_udmabuf(0, &size) != -1 || errno != EINVAL)
		failed = 1;
	printf("ERROR size-0 errno=%d %s\n", errno, dmabuf_alloc_error());
	if (dmabuf_alloc_from("nvidia", 4096, &size) != -1 || errno != EINVAL)
		failed = 1;
	printf("ERROR bad-source errno=%d %s\n", errno, dmabuf_alloc_error());
	if (dmabuf_alloc_size(STDIN_FILENO, &size) != -1 || errno != EINVAL)
		failed = 1;
	printf("ERROR not-a-dmabuf errno=%d %s\n", errno, dmabuf_alloc_error());
	if (dmabuf_alloc_heap("no-such-heap", 4096, &size) != -1 || errno != ENOENT)
		failed = 1;
	printf("ERROR no-heap errno=%d %s\n", errno, dmabuf_alloc_error());
	return failed;
}
