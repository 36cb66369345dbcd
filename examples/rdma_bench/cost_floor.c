/*
 * The floor for `rdma_bench cost`: the same loop straight over libibverbs, so that an
 * instruction counter can tell what the provider itself costs per RDMA write and what the
 * Rust layers add. Two RC queue pairs of this process talk over the device's loopback; each
 * iteration arms the completion channel, posts one signalled write (measured_post), sleeps on
 * the channel until the completion is queued, and takes it with exactly one ibv_poll_cq
 * (measured_complete). Count with:
 *
 *   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
 *       cost_floor DEVICE GID_INDEX SIZE ITERS [BATCH] [extended]
 *
 * With BATCH (at most 16), each iteration posts BATCH writes as one chain in one
 * ibv_post_send, only the last signalled, and takes the one completion: the floor for
 * `rdma_bench cost --series batch`.
 *
 * With a last argument `extended`, the same loop over the extended verbs instead, as the
 * `sideway` crate uses them: the queue pair from ibv_create_qp_ex, the writes built with
 * ibv_wr_start, ibv_wr_rdma_write, ibv_wr_set_sge and ibv_wr_complete (a batch: BATCH of
 * them between one start and one complete), the completion queue from ibv_create_cq_ex and
 * the completion taken with ibv_start_poll and ibv_end_poll. The provider's own share is
 * smaller there (rxe writes each request straight into its queue, with no ibv_send_wr to
 * convert).
 *
 * Built by the workspace's tests (cc -O2 ... -libverbs).
 */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BATCH 16

/* Whether the loop runs over the extended verbs (the last argument `extended`). */
static int extended;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_cap cap = { .max_send_wr = MAX_BATCH, .max_recv_wr = 4, .max_send_sge = 1,
				  .max_recv_sge = 1 };
	struct ibv_qp *qp;
	if (extended) {
		struct ibv_qp_init_attr_ex init = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = cap,
			.qp_type = IBV_QPT_RC,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = pd,
			.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
		};
		qp = ibv_create_qp_ex(pd->context, &init);
	} else {
		struct ibv_qp_init_attr init = {
			.send_cq = cq,
			.recv_cq = cq,
			.cap = cap,
			.qp_type = IBV_QPT_RC,
		};
		qp = ibv_create_qp(pd, &init);
	}
	if (!qp)
		die(extended ? "ibv_create_qp_ex" : "ibv_create_qp");
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS))
		die("INIT");
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid, int gid_index)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest,
		.rq_psn = 0,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.grh = { .dgid = gid, .sgid_index = gid_index, .hop_limit = 64 },
			.port_num = 1,
		},
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	struct ibv_qp_attr s = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 16,
		.retry_cnt = 6,
		.rnr_retry = 6,
		.sq_psn = 0,
		.max_rd_atomic = 1,
	};
	if (ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

__attribute__((noinline)) static int measured_post(struct ibv_qp *qp, struct ibv_sge *sge,
						   uint64_t addr, uint32_t rkey)
{
	struct ibv_send_wr wr = {
		.wr_id = 1,
		.sg_list = sge,
		.num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = addr, .rkey = rkey },
	};
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, &wr, &bad);
}

/* BATCH writes chained in one ibv_post_send, only the last signalled. */
__attribute__((noinline)) static int measured_post_batch(struct ibv_qp *qp, struct ibv_sge *sge,
							 uint64_t addr, uint32_t rkey, int batch)
{
	struct ibv_send_wr wr[MAX_BATCH];
	for (int i = 0; i < batch; i++) {
		wr[i] = (struct ibv_send_wr){
			.wr_id = 1 + i,
			.next = i + 1 < batch ? &wr[i + 1] : NULL,
			.sg_list = &sge[i],
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE,
			.send_flags = i + 1 == batch ? IBV_SEND_SIGNALED : 0,
			.wr.rdma = { .remote_addr = addr, .rkey = rkey },
		};
	}
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) static int measured_complete(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n = ibv_poll_cq(cq, 1, &wc);
	return n == 1 && wc.status == IBV_WC_SUCCESS ? 0 : -1;
}

/* The extended verbs: BATCH writes (1: one) between one ibv_wr_start and one ibv_wr_complete,
 * only the last signalled. */
__attribute__((noinline)) static int measured_post_extended(struct ibv_qp_ex *qp,
							    struct ibv_sge *sge, uint64_t addr,
							    uint32_t rkey, int batch)
{
	ibv_wr_start(qp);
	for (int i = 0; i < batch; i++) {
		qp->wr_id = 1 + i;
		qp->wr_flags = i + 1 == batch ? IBV_SEND_SIGNALED : 0;
		ibv_wr_rdma_write(qp, rkey, addr);
		ibv_wr_set_sge(qp, sge[i].lkey, sge[i].addr, sge[i].length);
	}
	return ibv_wr_complete(qp);
}

__attribute__((noinline)) static int measured_complete_extended(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	if (ibv_start_poll(cq, &attr))
		return -1;
	int ok = cq->status == IBV_WC_SUCCESS;
	ibv_end_poll(cq);
	return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
	if (argc > 5 && !strcmp(argv[argc - 1], "extended")) {
		extended = 1;
		argc--;
	}
	if (argc != 5 && argc != 6) {
		fprintf(stderr, "usage: cost_floor DEVICE GID_INDEX SIZE ITERS [BATCH] [extended]\n");
		return 2;
	}
	int batch = argc == 6 ? atoi(argv[5]) : 1;
	if (batch < 1 || batch > MAX_BATCH) {
		fprintf(stderr, "BATCH is 1 to %d\n", MAX_BATCH);
		return 2;
	}
	int gid_index = atoi(argv[2]);
	size_t size = strtoul(argv[3], NULL, 0);
	long iters = atol(argv[4]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq_init_attr_ex cq_init = { .cqe = 8, .channel = ch,
					       .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *cq_ex = extended ? ibv_create_cq_ex(ctx, &cq_init) : NULL;
	struct ibv_cq *cq = extended ? (cq_ex ? ibv_cq_ex_to_cq(cq_ex) : NULL)
				     : ibv_create_cq(ctx, 8, NULL, ch, 0);
	struct ibv_cq *other = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	if (!pd || !ch || !cq || !other)
		die("pd, channel or cq");
	/* One source buffer per write of a batch, as rdma_bench's batch has one region each. */
	char *src = calloc(MAX_BATCH, size), *dst = calloc(1, size);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, MAX_BATCH * size, 0);
	struct ibv_mr *dmr = ibv_reg_mr(pd, dst, size, IBV_ACCESS_LOCAL_WRITE |
							      IBV_ACCESS_REMOTE_WRITE);
	if (!smr || !dmr)
		die("ibv_reg_mr");
	struct ibv_qp *a = make_qp(pd, cq), *b = make_qp(pd, other);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gid_index, &gid))
		die("ibv_query_gid");
	connect_qp(a, b->qp_num, gid, gid_index);
	connect_qp(b, a->qp_num, gid, gid_index);
	struct ibv_qp_ex *a_ex = extended ? ibv_qp_to_qp_ex(a) : NULL;
	if (extended && !a_ex)
		die("ibv_qp_to_qp_ex");
	struct ibv_sge sge[MAX_BATCH];
	for (int i = 0; i < MAX_BATCH; i++)
		sge[i] = (struct ibv_sge){ .addr = (uintptr_t)(src + i * size), .length = size,
					   .lkey = smr->lkey };
	for (long i = 0; i < iters; i++) {
		if (ibv_req_notify_cq(cq, 0))
			die("ibv_req_notify_cq");
		int rc = extended ? measured_post_extended(a_ex, sge, (uintptr_t)dst, dmr->rkey,
							   batch)
			 : batch == 1 ? measured_post(a, sge, (uintptr_t)dst, dmr->rkey)
				      : measured_post_batch(a, sge, (uintptr_t)dst, dmr->rkey, batch);
		if (rc)
			die("ibv_post_send");
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx))
			die("ibv_get_cq_event");
		ibv_ack_cq_events(ev_cq, 1);
		if (extended ? measured_complete_extended(cq_ex) : measured_complete(cq))
			die("the completion was not in the queue after its event");
	}
	printf("RESULT cost_iters=%ld size=%zu series=%s writes_per_iter=%d\n", iters, size,
	       extended ? "c-extended" : "c", batch);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_dereg_mr(smr);
	ibv_dereg_mr(dmr);
	ibv_destroy_cq(cq);
	ibv_destroy_cq(other);
	ibv_destroy_comp_channel(ch);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
