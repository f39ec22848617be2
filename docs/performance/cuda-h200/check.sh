#!/bin/bash
# Device check: the exported CUDA kernels (tvm_convgrad.tools.bench.cuda_export) on this GPU.
cd "$(dirname "$0")"
export TVM_USE_RUNTIME_LIB=1 PYTHONPATH=$PWD/site PYTHONUNBUFFERED=1
CUDART=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' 2>/dev/null | head -1)
[ -n "$CUDART" ] && export LD_LIBRARY_PATH=$(dirname "$CUDART"):$LD_LIBRARY_PATH
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
{ nvidia-smi -L; echo "cudart $CUDART sanitizer $SAN"; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())"; } 2>&1 | tee $OUT/env.log
timeout 330 python3 kernels/cuda_remote.py kernels --rounds 3 --sample-s 0.03 --out $OUT/gpu.json > $OUT/gpu.log 2>&1; echo "gpu rc $?" | tee -a $OUT/gpu.log
tail -25 $OUT/gpu.log
MEM='wgrad_resnet_50_v1_5_conv1_n1|dgrad_resnet_50_v1_5_res3a_branch1_n1|wgrad_resnet_50_v1_5_res2a_branch1_n8|wgrad_resnet_50_v1_5_res3b_branch2b_n1|dgrad_resnet_50_v1_5_res3a_branch2b_n1|dgrad_resnet_50_v1_5_conv1_n1|fwd_resnet_50_v1_5_res3a_branch2b_n1|dw144_s1_n1|dw144_s2_n1|dgrad_dilated_resnet_layer3_3x3_d2_n1|wgrad_resnext_101_conv18_n1'
timeout 80 $SAN --tool memcheck --print-limit 10 python3 kernels/cuda_remote.py kernels --no-time --only "$MEM" > $OUT/memcheck.log 2>&1; echo "memcheck rc $?" | tee -a $OUT/memcheck.log
tail -15 $OUT/memcheck.log
RACE='wgrad_resnet_50_v1_5_conv1_n1|dgrad_resnet_50_v1_5_res3a_branch1_n1|wgrad_resnet_50_v1_5_res3b_branch2b_n1|dgrad_resnet_50_v1_5_res3a_branch2b_n1|wgrad_mobilenet_v2_dw144_s1_n1|wgrad_resnet_50_v1_5_res2a_branch1_n8|fwd_resnet_50_v1_5_res4a_branch2b_n1'
timeout 80 $SAN --tool racecheck --print-limit 10 python3 kernels/cuda_remote.py kernels --no-time --only "$RACE" > $OUT/racecheck.log 2>&1; echo "racecheck rc $?" | tee -a $OUT/racecheck.log
tail -12 $OUT/racecheck.log
INIT='wgrad_resnet_50_v1_5_conv1_n1|dgrad_resnet_50_v1_5_res3a_branch1_n1|wgrad_resnet_50_v1_5_res2a_branch1_n8|wgrad_mobilenet_v2_dw144_s1_n1'
timeout 60 $SAN --tool initcheck --print-limit 10 python3 kernels/cuda_remote.py kernels --no-time --only "$INIT" > $OUT/initcheck.log 2>&1; echo "initcheck rc $?" | tee -a $OUT/initcheck.log
tail -10 $OUT/initcheck.log
