include $(sort $(wildcard $(BR2_EXTERNAL_NPU_PATH)/package/*/*.mk))
